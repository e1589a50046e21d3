from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dsv4bench.measure import timing

ROOT = Path(__file__).resolve().parents[2]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_percentile_linear_between_ranks():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert timing.percentile(xs, 50) == 3.0
    assert timing.percentile(xs, 10) == pytest.approx(1.4)
    assert timing.percentile(xs, 90) == pytest.approx(4.6)
    assert timing.percentile(xs, 0) == 1.0 and timing.percentile(xs, 100) == 5.0
    assert timing.percentile([7.0], 90) == 7.0
    assert math.isnan(timing.percentile([], 50))


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_properties(xs, q):
    p = timing.percentile(xs, q)
    assert min(xs) <= p <= max(xs)
    assert timing.percentile(xs, 50) == pytest.approx(statistics.median(xs))
    assert timing.percentile(xs, min(q + 10, 100)) >= p - 1e-9


def test_summarize():
    s = timing.summarize([1, 2, 3, 4], "perf_counter")
    assert s == {
        "median_ms": 2.5,
        "p10_ms": pytest.approx(1.3),
        "p90_ms": pytest.approx(3.7),
        "n": 4,
        "method": "perf_counter",
        "samples_ms": [1.0, 2.0, 3.0, 4.0],
    }


def test_cpu_timing_of_a_known_wait():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    t = timing.measure(fn, device="cpu", warmup=2, iters=5)
    assert len(calls) == 7
    assert t["method"] == "perf_counter" and t["n"] == 5 and len(t["samples_ms"]) == 5
    assert 1.9 <= t["p10_ms"] <= t["median_ms"] <= t["p90_ms"] < 200


def test_gpu_warm_up_runs_on_until_the_clocks_settle():
    """The requested calls, then more until WARM_S has passed (fake clock: 10 ms a call),
    capped; no call at all when none is asked for (the limit search's probes)."""
    now = [0.0]
    calls = []

    def fn():
        calls.append(1)
        now[0] += 0.01

    made = timing.warm_up(fn, 3, sync=lambda: None, min_s=0.05, clock=lambda: now[0])
    assert made == len(calls) == 5  # 3 asked, then 2 more to reach 50 ms
    calls.clear()
    assert timing.warm_up(fn, 0, sync=lambda: None, min_s=0.05, clock=lambda: now[0]) == 0
    assert not calls
    slow = timing.warm_up(lambda: None, 1, sync=lambda: None, min_s=1e9, clock=lambda: 0.0)
    assert slow == 1 + timing.WARM_MAX_CALLS


def test_bad_timer_and_iters():
    with pytest.raises(ValueError, match="timer"):
        timing.measure(lambda: None, device="cpu", timer="cupti")
    with pytest.raises(ValueError, match="iters"):
        timing.measure(lambda: None, device="cpu", iters=0)


def test_time_in_spans():
    spans = [(30.0, 40.0), (10.0, 20.0)]  # out of order on purpose
    activities = [
        (5.0, 9.0),  # the L2 flush, before the first span
        (10.0, 12.0),  # first kernel opens the span
        (13.0, 19.0),
        (19.5, 20.0),  # last kernel closes it
        (21.0, 29.0),  # the flush between iterations
        (30.0, 39.0),
        (41.0, 45.0),  # after every span
    ]
    assert timing.time_in_spans(spans, activities, how="union") == [8.5, 9.0]
    assert timing.time_in_spans(spans, activities, how="sum") == [8.5, 9.0]
    assert timing.time_in_spans(spans, activities) == [10.0, 9.0]  # makespan: gaps count
    assert timing.time_in_spans([], activities) == []


def test_time_in_spans_counts_overlapping_kernels_once_and_gaps():
    spans = [(0.0, 100.0), (200.0, 300.0), (400.0, 500.0)]
    activities = [
        # overlapping (programmatic dependent launch): the next starts before the last ends
        (0.0, 30.0, "a"),
        (20.0, 50.0, "b"),
        # nested: one kernel entirely inside another
        (200.0, 260.0, "a"),
        (210.0, 220.0, "b"),
        (230.0, 240.0, "c"),
        # disjoint, with a gap between
        (400.0, 410.0, "a"),
        (450.0, 470.0, "b"),
    ]
    assert timing.time_in_spans(spans, activities, how="union") == [50.0, 60.0, 30.0]
    assert timing.time_in_spans(spans, activities, how="sum") == [60.0, 80.0, 30.0]
    # makespan: overlap once, and the gap between disjoint kernels of one call too
    assert timing.time_in_spans(spans, activities) == [50.0, 60.0, 70.0]


def test_union_length():
    assert timing.union_length([]) == 0.0
    assert timing.union_length([(5, 6), (0, 2), (1, 3)]) == 4.0
    assert timing.union_length([(0, 10), (2, 3), (9, 12)]) == 12.0
    assert timing.union_length([(0, 1), (1, 2)]) == 2.0


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 50)), max_size=20))
def test_union_length_matches_a_grid(pairs):
    intervals = [(a, a + d) for a, d in pairs]
    covered = {t for a, b in intervals for t in range(a, b)}
    assert timing.union_length(intervals) == len(covered)
    assert timing.union_length(intervals) <= sum(b - a for a, b in intervals)


def test_kernel_breakdown():
    spans = [(0.0, 100.0), (200.0, 300.0)]
    activities = [
        (0.0, 40.0, "attn"),
        (40.0, 50.0, "combine"),
        (60.0, 65.0, "combine"),
        (200.0, 260.0, "attn"),
        (260.0, 270.0, "combine"),
        (150.0, 190.0, "flush"),  # between spans: not the call's
    ]
    rows = timing.kernel_breakdown(spans, activities)
    assert [r["name"] for r in rows] == ["attn", "combine"]
    assert rows[0] == {"name": "attn", "count": 1.0, "ms": pytest.approx(0.05)}
    assert rows[1] == {"name": "combine", "count": 1.5, "ms": pytest.approx(0.0125)}
    many = [(float(i), i + 0.5, f"k{i}") for i in range(10)]
    top = timing.kernel_breakdown([(0.0, 20.0)], many, top=3)
    assert [r["name"] for r in top][-1] == "(other)" and len(top) == 3
    assert sum(r["count"] for r in top) == 10
    assert sum(r["ms"] for r in top) == pytest.approx(5 * 1e-3)


def _event(name, start, end, device="CUDA", annotation=False):
    return SimpleNamespace(
        name=name,
        device_type=SimpleNamespace(name=device),
        time_range=SimpleNamespace(start=start, end=end),
        is_user_annotation=annotation,
    )


def test_profiler_kernel_ms_from_function_events():
    # shaped like torch 2.11's prof.events() for: flush; range(triton kernel, aten::add_) x2
    events = [
        _event("aten::zero_", 0, 50, device="CPU"),
        _event("void at::native::vectorized_elementwise_kernel", 60, 140),  # flush
        _event(timing.RANGE, 150, 400, device="CPU", annotation=True),
        _event("cuLaunchKernelEx", 160, 170, device="CPU"),
        _event(timing.RANGE, 200, 260, annotation=True),
        _event("scale", 200, 240),  # Triton: no torch op around its launch
        _event("other::annotation", 245, 260, annotation=True),  # nested user range: no time
        _event("void at::native::vectorized_elementwise_kernel", 250, 260),
        _event("void at::native::vectorized_elementwise_kernel", 270, 350),  # flush
        _event(timing.RANGE, 360, 405, annotation=True),
        _event("Memcpy DtoD (Device -> Device)", 360, 405),
    ]
    got = timing.profiler_kernel_ms(events)
    assert got == [pytest.approx(0.060), pytest.approx(0.045)]  # makespan: the 10 us gap counts
    spans, activities = timing.profiler_activities(events)
    assert spans == [(200, 260), (360, 405)]
    assert ("scale", 200, 240) not in activities and (200, 240, "scale") in activities
    assert all(name != "other::annotation" for *_, name in activities)


def test_poison():
    f = torch.zeros(4)
    bf = torch.zeros(2, 2, dtype=torch.bfloat16)
    fp8 = torch.zeros(3, dtype=torch.float8_e4m3fn)
    i32 = torch.zeros(5, dtype=torch.int32)
    i64 = torch.zeros(2, dtype=torch.int64)
    u8 = torch.zeros(2, dtype=torch.uint8)
    b = torch.zeros(2, dtype=torch.bool)
    timing.poison(f, bf, None, fp8, i32, i64, u8, b)
    assert f.isnan().all() and bf.isnan().all() and fp8.float().isnan().all()
    assert (i32 == -(2**31) + 1).all() and (i64 == -(2**63) + 1).all()
    assert (u8 == 255).all() and not b.any()


@pytest.mark.gpu
@needs_gpu
def test_gpu_copy_events_and_profiler_agree():
    n = 64 * 2**20  # 256 MiB of fp32 each way: ~0.2 ms on an H100
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    t = timing.measure(lambda: dst.copy_(src), device="cuda", warmup=3, iters=20, timer="both")
    assert t["method"] == "cuda-events+profiler+l2flush" and t["n"] == 20
    tb_per_s = 2 * src.nbytes / (t["median_ms"] * 1e-3) / 1e12
    assert 0.3 < tb_per_s < 10, t
    assert len(t["profiler_samples_ms"]) == 20
    assert abs(t["events_vs_profiler"] - 1) < 0.05, t
    assert t["events_agree"] is True
    assert t["kernels"] and t["kernels"][0]["count"] == 1, t["kernels"]
    assert t["profiler_sum_ms"] >= t["profiler_ms"] * 0.999
    assert t["memory"]["scratch_bytes"] == 0 and t["memory"]["output_bytes"] == 0

    events_only = timing.measure(lambda: dst.copy_(src), device="cuda", iters=10)
    assert events_only["method"] == "cuda-events+l2flush" and "profiler_ms" not in events_only
    assert events_only["median_ms"] == pytest.approx(t["median_ms"], rel=0.2)


@pytest.mark.gpu
@needs_gpu
def test_gpu_profiler_attributes_triton_kernels():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    n = 32 * 2**20
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)

    def fn():
        scale[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)

    t = timing.measure(fn, device="cuda", iters=10, timer="profiler")
    assert t["method"] == "cuda-profiler+l2flush"
    assert t["median_ms"] > 0 and all(ms > 0 for ms in t["samples_ms"]), t
    assert abs(t["events_vs_profiler"] - 1) < 0.1, t


@pytest.mark.gpu
@needs_gpu
def test_gpu_memory_per_call_sees_scratch_and_outputs():
    x = torch.randn(1 << 20, device="cuda")

    def fn():
        scratch = x * 2  # 4 MiB freed before the call returns
        return scratch.sum(dim=0, keepdim=True) + x  # 4 MiB kept: the output

    m = timing.memory_per_call(fn, torch.device("cuda"))
    assert m["output_bytes"] == x.nbytes
    assert m["scratch_bytes"] >= x.nbytes


@pytest.mark.gpu
@needs_gpu
def test_gpu_graph_times_and_capture_failure():
    x = torch.randn(1 << 16, device="cuda")
    y = torch.empty_like(x)
    t = timing.measure(lambda: torch.mul(x, 2, out=y), device="cuda", iters=10, graph=True)
    assert t["graph_ms"] > 0 and len(t["graph_samples_ms"]) == 10
    # a tiny kernel is launch-bound: back-to-back eager calls cost more than replays
    assert t["eager_loop_ms"] > t["graph_loop_ms"], t
    # a failed capture leaves torch's CUDA generator in capture mode: its own process
    code = (
        "import torch\n"
        "from dsv4bench.measure import timing\n"
        "x = torch.randn(1 << 16, device='cuda')\n"
        "g = timing.graph_times(lambda: (x * 2).sum().item(), torch.device('cuda'), iters=3)\n"
        "assert 'graph_error' in g and 'graph_ms' not in g, g\n"
        "print('captured-error', g['graph_error'][:60])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert p.returncode == 0 and "captured-error" in p.stdout, p.stderr
