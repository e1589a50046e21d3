"""The project's Triton kernels against the engine kernel of the same op, one line per case of a
run: status, accuracy, times, the throughput ratio (engine time / Triton time; > 1: Triton is
faster), issue 20's target and the roofline fraction of each; then the median ratio of each
target group and the verdicts.

    python3 tools/triton_summary.py RUN_DIR/results.jsonl

Attention rows compare with flashmla, indexer rows with deepgemm.
"""

from __future__ import annotations

import json
import statistics
import sys

ENGINE = {"decode": "flashmla", "prefill": "flashmla", "indexer": "deepgemm"}


def group(p: dict) -> tuple[str, float, float | None] | None:
    """(target group, median target, floor) of issue 20, or None for a case without one."""
    if p["op"] == "indexer":  # a target per form: ragged (prefill chunks), paged (decode)
        return ("indexer ragged" if p["tokens"] else "indexer paged", 0.8, None)
    full_heads = {"v3.2": 128, "v4-flash": 64, "v4-pro": 128}[p["model"]]
    if p["num_heads"] < full_heads and p["num_heads"] <= 32:
        return ("heads<=32", 1.0, 1.0)
    if p["op"] == "decode" and p["batch_size"] >= 64:
        return ("decode b>=64", 0.67, 0.55)
    if p["op"] == "prefill" and p["tokens"] >= 4096 and p["route"] == "sparse-prefill":
        return ("prefill >=4096", 0.6, None)
    return None


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _line(case_id: str, t: dict, e: dict | None, engine: str) -> float | None:
    p = t["params"]
    t_ms = (t.get("timing") or {}).get("median_ms")
    e_ms = (e.get("timing") or {}).get("median_ms") if e else None
    ratio = e_ms / t_ms if t_ms and e_ms else None
    g = group(p)
    cos = (t.get("accuracy") or {}).get("cos_diff")
    frac_t = ((t.get("derived") or {}).get("peak_fraction")) or 0.0
    frac_e = (((e or {}).get("derived") or {}).get("peak_fraction")) or 0.0
    info = t.get("info") or {}
    print(
        f"{case_id[:52]:52s} s_q={p['s_q']} {t['status']:9s} cos={_num(cos, '.2g')}"
        f" triton={_num(t_ms, '.4f')} {engine}={_num(e_ms, '.4f')}"
        f" ratio={_num(ratio, '.3f')} group={g[0] if g else '-'}"
        f" roof(t/e)={frac_t:.2f}/{frac_e:.2f} splits={info.get('splits')}"
        f" bh={info.get('block_h')} {(e or {}).get('status', '') if ratio is None else ''}"
    )
    return ratio


def main(path: str) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    cases: dict[str, dict] = {}
    for r in rows:
        if r.get("kind") == "case":
            cases.setdefault(r["case_id"], {})[r["backend"]] = r
    ratios: dict[tuple, list[float]] = {}
    for case_id, by in cases.items():
        t = by.get("triton")
        if t is None:
            continue
        engine = ENGINE[t["params"]["op"]]
        ratio = _line(case_id, t, by.get(engine), engine)
        g = group(t["params"])
        if g is not None and ratio is not None:
            ratios.setdefault(g, []).append(ratio)
    for (name, goal, floor), rs in ratios.items():
        med = statistics.median(rs)
        low = min(rs)
        verdict = "met" if med >= goal and (floor is None or low >= floor) else "MISSED"
        print(f"{name:16s} {len(rs):3d} cases: median {med:.3f} (target {goal}), min {low:.3f}"
              f" (floor {floor}) -> {verdict}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
