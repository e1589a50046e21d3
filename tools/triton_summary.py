"""Triton vs FlashMLA, one line per case of a run: status, accuracy, times, the throughput ratio
(FlashMLA time / Triton time; > 1: Triton is faster), the issue-10 target and the roofline
fraction of each.

    python3 tools/triton_summary.py RUN_DIR/results.jsonl
"""

from __future__ import annotations

import json
import sys


def target(p: dict) -> float | None:
    """Issue 10's ratio targets: TP-split heads 1.0, decode b >= 64 0.67, prefill >= 4096 0.5."""
    full_heads = {"v3.2": 128, "v4-flash": 64, "v4-pro": 128}[p["model"]]
    if p["num_heads"] < full_heads and p["num_heads"] in (8, 16, 32):
        return 1.0
    if p["op"] == "decode" and p["batch_size"] >= 64:
        return 0.67
    if p["op"] == "prefill" and p["tokens"] >= 4096 and p["route"] == "sparse-prefill":
        return 0.5
    return None


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def main(path: str) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    cases: dict[str, dict] = {}
    for r in rows:
        if r.get("kind") == "case":
            cases.setdefault(r["case_id"], {})[r["backend"]] = r
    met = missed = 0
    for case_id, by in cases.items():
        t, f = by.get("triton"), by.get("flashmla")
        if t is None:
            continue
        p = t["params"]
        t_ms = (t.get("timing") or {}).get("median_ms")
        f_ms = (f.get("timing") or {}).get("median_ms") if f else None
        ratio = f_ms / t_ms if t_ms and f_ms else None
        goal = target(p)
        verdict = ""
        if goal is not None and ratio is not None:
            verdict = "met" if ratio >= goal else "MISSED"
            met, missed = met + (ratio >= goal), missed + (ratio < goal)
        cos = (t.get("accuracy") or {}).get("cos_diff")
        frac_t = ((t.get("derived") or {}).get("peak_fraction")) or 0.0
        frac_f = (((f or {}).get("derived") or {}).get("peak_fraction")) or 0.0
        info = t.get("info") or {}
        print(
            f"{case_id[:52]:52s} s_q={p['s_q']} {t['status']:9s} cos={_num(cos, '.2g')}"
            f" triton={_num(t_ms, '.4f')} flashmla={_num(f_ms, '.4f')}"
            f" ratio={_num(ratio, '.3f')} target={goal} {verdict}"
            f" roof(t/f)={frac_t:.2f}/{frac_f:.2f} splits={info.get('splits')}"
            f" bh={info.get('block_h')} {t.get('message', '')[:80]}"
        )
    print(f"targets met {met}, missed {missed}")


if __name__ == "__main__":
    main(sys.argv[1])
