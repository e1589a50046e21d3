"""The indexer's share of V4-Flash TTFT/TPOT from rows: the serving plan of
scenarios/serving/v4_flash_indexer_sm90.yaml aggregated over the given runs' case rows (the
attention, dequant and remap parts from one run, the indexer parts from another, as measured).

    python tools/indexer_share.py RUN_DIR... [--json OUT] [--rows SERVING_RUN_DIR]

Prints one line per TTFT / TPOT point: total, indexer ms and share. Rows from different GPUs
can be combined; each part names the GPU its row came from (env.gpu) in the JSON output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4bench import backends  # noqa: E402
from dsv4bench.scenarios import load_serving  # noqa: E402
from dsv4bench.serving import aggregate, plan  # noqa: E402

SPEC = Path(__file__).resolve().parent.parent / "scenarios/serving/v4_flash_indexer_sm90.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rows", type=Path, help="write the serving rows as RUN_DIR/results.jsonl")
    ap.add_argument("--safe-limit", type=int, default=None)
    a = ap.parse_args()
    rows = []
    for run in a.runs:
        for line in (run / "results.jsonl").read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    spec = load_serving(SPEC, known_backends=backends.names())
    serving = aggregate(plan(spec), rows)
    gpus = {(r.get("case_id"), r.get("backend")): (r.get("env") or {}).get("gpu") for r in rows}
    for r in serving:
        b = r.get("breakdown_ms") or {}
        where = r["prompt_len"] if r["metric"] == "ttft" else f"B{r['batch_size']}"
        ctx = f"C{r['chunk_size']}" if r["metric"] == "ttft" else f"S{r['context_len']}"
        if r["value_ms"] is None:
            print(
                f"{r['metric']} {r['route']:15} {where!s:>7} {ctx:7} {r['status']}: "
                f"{r['message'][:90]}"
            )
            continue
        ix = b.get("indexer", 0.0)
        print(
            f"{r['metric']} {r['route']:15} {where!s:>7} {ctx:7} total {r['value_ms']:9.3f} ms"
            f"  indexer {ix:8.3f} ms  share {100 * ix / r['value_ms']:5.1f}%"
        )
        for p in r["parts"]:
            p["gpu"] = gpus.get((p["case_id"], p["backend"]))
    if a.json:
        a.json.write_text(json.dumps(serving, indent=1, default=str))
    if a.rows:  # a run folder `dsv4bench report` reads: TTFT/TPOT curves and the indexer share
        a.rows.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r, default=str) + "\n" for r in serving)
        (a.rows / "results.jsonl").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
