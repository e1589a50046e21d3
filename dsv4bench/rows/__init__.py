"""Rows: what a run leaves behind. `schema` holds the typed rows (case, limit, serving) with their
invariants; `results` appends them to and reads them from RUN_DIR/results.jsonl. Imports nothing
from the rest of the suite, so every stage may import it."""

from dsv4bench.rows.schema import *  # noqa: F401,F403
