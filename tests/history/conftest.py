"""A history of the committed CPU smoke baseline: the rows as committed, a re-run of them 1 %
slower (noise), then the same rows with a planted 10 % slowdown, and its trend page."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.in_process import main_in_process

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "results" / "cpu" / "smoke"
TIMES = ("median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "q1_ms", "q3_ms")


def slowed_run(
    folder: Path, factor: float, source: Path = BASELINE, only: Callable[[dict], bool] = None
) -> Path:
    """A copy of a run whose every timing (of the rows `only` picks) is `factor` times the
    source's."""
    folder.mkdir(parents=True)
    with (source / "results.jsonl").open() as f, (folder / "results.jsonl").open("w") as out:
        for line in f:
            row = json.loads(line)
            timing = row.get("timing")
            if timing and (only is None or only(row)):
                for k in TIMES:
                    if isinstance(timing.get(k), (int, float)):
                        timing[k] *= factor
                timing["samples_ms"] = [s * factor for s in timing.get("samples_ms") or []]
            out.write(json.dumps(row) + "\n")
    return folder


def history_of(root: Path, factors: list[float]) -> Path:
    """A history of the baseline's rows scaled by each factor in turn, a day apart."""
    history = root / "history"
    for day, factor in enumerate(factors, start=1):
        run = slowed_run(root / f"run{day}-x{factor}", factor)
        date = f"2026-12-0{day}T12:00:00+00:00"
        assert main_in_process("history", "add", run, "--history", history, "--date", date) == 0
    return history


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, Path]:
    """(history, page folder): the baseline, a 1 % slower re-run, a 10 % slowdown."""
    root = tmp_path_factory.mktemp("planted")
    history = history_of(root, [1.0, 1.01, 1.10])
    page = root / "page"
    assert main_in_process("history", "page", "--history", history, "--out", page) == 0
    return history, page
