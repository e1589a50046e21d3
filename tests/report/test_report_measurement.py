"""The report's measurement sections read the fields the worker writes."""

from __future__ import annotations

from dsv4bench.report.render import build_report
from tests.factories import write_run


def _row(i: int, backend: str = "flashmla", **timing) -> dict:
    return {
        "kind": "case",
        "scenario": "m",
        "case_id": f"decode-v3.2-v32-h128-b{2**i}-k2048-{i:010d}",
        "op": "decode",
        "params": {"model": "v3.2", "batch_size": 2**i, "s_q": 1, "num_heads": 128},
        "backend": backend,
        "status": "ok",
        "accuracy": {
            "cos_diff": 1e-6,
            "determinism": {"bitwise_equal": i != 2, "max_abs": 0.0 if i != 2 else 0.5},
            "batch_invariance": {
                "requests": [0, 1],
                "max_ulps": i,
                "argmax_changed": 0,
                "rows": 256,
            },
        },
        "tolerance": {"cos_diff": 5e-6, "lse_abs": 1e-3},
        "timing": {
            "median_ms": 0.1 * (i + 1),
            "profiler_ms": 0.1 * (i + 1) / (1.2 if i == 3 else 1.0),
            "events_vs_profiler": 1.2 if i == 3 else 1.0,
            "profiler_sum_ms": 0.2 * (i + 1),
            "kernels": [{"name": "flash_fwd_splitkv", "count": 1.0, "ms": 0.1}],
            "graph_ms": 0.09 * (i + 1),
            "eager_loop_ms": 0.1 * (i + 1) + 0.01,
            "graph_loop_ms": 0.1 * (i + 1),
            "memory": {"scratch_bytes": (i + 1) * 2**20, "output_bytes": 0},
            **timing,
        },
    }


def test_measurement_sections(tmp_path):
    rows = [_row(i) for i in range(4)]
    rows.append(
        _row(4, graph_error="RuntimeError: operation not permitted when stream is capturing")
    )
    oracle = _row(5, backend="torch", events_vs_profiler=5.0)
    oracle["info"] = {"reference_row": "the oracle itself"}
    rows.append(oracle)
    run = tmp_path / "run"
    write_run(run, rows)
    build_report([run], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    # 5 kernel rows >= 20 us; the oracle's host-bound row is left out; one disagrees (x1.2)
    assert "for 4 of 5 cases of 20 us or more" in md
    assert (
        "Against the plain sum of kernel durations (overlapping kernels counted twice): 0 of 5"
        in md
    )
    # the disagreeing row, its ratio named by what divides what
    assert "| sum ms | events / profiler | kernels |" in md and "| 1.200 |" in md
    assert "## Eager against CUDA graph" in md and "operation not permitted" in md
    assert (tmp_path / "rep" / "launch-overhead.png").exists()
    assert (tmp_path / "rep" / "memory-per-call.png").exists()
    assert "1 of 6 rows not bitwise deterministic" in md
    assert "5 of 6 rows not batch invariant" in md


def test_memory_lines_per_family_and_all_zero_panels_named_not_drawn(tmp_path, monkeypatch):
    from dsv4bench.report import plots

    drawn = {}
    save = plots.save

    def keep(fig, path):
        drawn[path.name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save", keep)
    rows = []
    for i in range(3):  # two contexts at the same batch sizes: two lines, not a zigzag
        for ctx, mib in ((8192, 16 + i), (65536, 40 + i)):
            r = _row(i, memory={"scratch_bytes": mib * 2**20, "output_bytes": 0})
            r["params"]["context_len"] = ctx
            r["case_id"] += f"-{ctx}"
            rows.append(r)
        zero = _row(i, memory={"scratch_bytes": 0, "output_bytes": 0})
        zero.update(op="prefill", case_id=f"prefill-{i}")
        zero["params"].update(tokens=1024 * 2**i, batch_size=1)
        rows.append(zero)
    dequant = _row(0, memory={"scratch_bytes": 2**20, "output_bytes": 0})
    dequant.update(op="dequant", case_id="dequant-0")  # its size is no batch: table only
    rows.append(dequant)
    run = tmp_path / "run"
    write_run(run, rows)
    build_report([run], tmp_path / "rep")
    fig = drawn["memory-per-call.png"]
    (ax,) = [a for a in fig.axes if a.get_visible()]  # the all-zero prefill panel is not drawn
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
    assert sorted(list(ln.get_ydata()) for ln in lines) == [[16, 17, 18], [40, 41, 42]]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Not drawn, every call 0 MiB of scratch: prefill v3.2 (flashmla)." in md
    assert "In the table only: dequant: the figure draws decode and prefill calls only." in md
