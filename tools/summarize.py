"""The headline numbers of an sm90 results set, as the README quotes them.

    python tools/summarize.py results/sm90/h200-bench-1 results/sm90/h200-bench-2 \
        results/sm90/h200-serving
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4bench.rows.results import read_rows  # noqa: E402

ANCHORS = {  # KERNEL_FACTS section 7 (H100): (model, op, batch, s_q, tokens, heads) -> ms
    ("v3.2", "decode", 64, 1, 0, 128): 0.110,
    ("v3.2", "decode", 128, 2, 0, 128): 0.418,
    ("v4-flash", "decode", 64, 1, 0, 64): 0.044,
    ("v4-pro", "decode", 128, 1, 0, 128): 0.066,
}


def timed(rows, backend, min_ms):
    return [
        r
        for r in rows
        if r["kind"] == "case"
        and r["backend"] == backend
        and (r.get("timing") or {}).get("median_ms", 0) >= min_ms
        and "limit-probe" not in r["tags"]
    ]


def main(run1: str, run2: str, serving: str) -> None:
    a, b, s = read_rows(run1), read_rows(run2), read_rows(serving)
    env = next(r["env"] for r in a if r.get("env"))
    print(f"GPU {env['gpu']}, torch {env['torch']}, driver {env['driver']}")
    fm = [r for r in a if r["kind"] == "case" and r["backend"] == "flashmla"]
    prov = next(r["provider"] for r in fm if r.get("provider"))
    print(f"FlashMLA: {prov['name']} {prov['version']}")
    counts: dict = {}
    for r in a:
        counts[(r["backend"], r["status"])] = counts.get((r["backend"], r["status"]), 0) + 1
    print("run 1 rows:", ", ".join(f"{k[0]} {k[1]} {n}" for k, n in sorted(counts.items())))
    for op, tol in (("decode", 5e-6), ("prefill", 7e-6)):
        acc = [r["accuracy"]["cos_diff"] for r in fm if r["op"] == op and r.get("accuracy")]
        print(f"flashmla {op}: {len(acc)} cases, max cos_diff {max(acc):.2e} (tolerance {tol})")
    for r in a:
        if r["kind"] == "limit":
            print(f"limit {r['axis']}: last ok {r['last_ok']}, first fail {r['first_fail']}")
            print(f"  {r['status']}: {r['message'].splitlines()[-1]}")
    for backend in ("flashmla", "torch"):
        rows = [r for r in timed(a, backend, 0.02) if r["timing"].get("profiler_ms")]
        ratios = [r["timing"]["median_ms"] / r["timing"]["profiler_ms"] for r in rows]
        inside = sum(abs(x - 1) <= 0.05 for x in ratios)
        print(
            f"{backend}: events/profiler within 5% for {inside}/{len(ratios)} cases >= 20 us "
            f"(range {min(ratios):.3f}..{max(ratios):.3f})"
        )
        other = {(r["case_id"], r["backend"]): r for r in b}
        pairs = [
            (r, other[(r["case_id"], backend)])
            for r in timed(a, backend, 0.05)
            if (r["case_id"], backend) in other and other[(r["case_id"], backend)].get("timing")
        ]
        ratios = [o["timing"]["median_ms"] / r["timing"]["median_ms"] for r, o in pairs]
        inside = sum(abs(x - 1) <= 0.03 for x in ratios)
        print(
            f"{backend}: run 2 / run 1 within 3% for {inside}/{len(ratios)} cases >= 50 us "
            f"(range {min(ratios):.3f}..{max(ratios):.3f})"
        )
    for key, anchor in ANCHORS.items():
        model, op, batch, s_q, tokens, heads = key
        for r in timed(a, "flashmla", 0):
            p = r["params"]
            if (
                (p["model"], p["op"], p["batch_size"], p["s_q"], p["num_heads"])
                == (
                    model,
                    op,
                    batch,
                    s_q,
                    heads,
                )
                and p["context_len"] == 8192
                and p["compress_ratio"] in (0, 4)
            ):
                t = r["timing"]
                print(
                    f"{model} {op} b={batch} s_q={s_q} h={heads}: {t['median_ms']:.4f} ms "
                    f"(profiler {t.get('profiler_ms') or float('nan'):.4f}), "
                    f"{r['derived']['tflops']:.0f} TFLOP/s; H100 anchor {anchor} ms"
                )
    for r in s:
        if r["kind"] == "serving" and r["metric"] == "tpot" and r["batch_size"] in (1, 64, 128):
            value = f"{r['value_ms']:.3f} ms" if r["value_ms"] is not None else r["status"]
            print(f"TPOT {r['backend']} B={r['batch_size']} S={r['context_len']}: {value}")
    for r in s:
        if r["kind"] == "serving" and r["metric"] == "ttft" and r["prompt_len"] == 131072:
            value = f"{r['value_ms']:.0f} ms" if r["value_ms"] is not None else r["status"]
            print(f"TTFT L=128K C={r['chunk_size']} {r['route']}: {value}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
