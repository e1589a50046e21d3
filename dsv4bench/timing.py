"""Timing a zero-argument call: CUDA events with a cold L2 on a GPU, perf_counter on a CPU.

Statistics: percentiles interpolate linearly between the two nearest order statistics
(numpy's default, Hyndman-Fan type 7), so the median of an even count is the mean of the
middle two and p10/p90 of few samples stay inside the observed range.

Profiler kernel time (timer "profiler" or "both"): every timed call runs inside
`torch.profiler.record_function(RANGE)`. For such a range the profiler (kineto) also emits a
device-side event of the same name spanning, on the GPU timeline, the GPU work launched inside
the range: it links each kernel, memcpy or memset to its launch through CUPTI correlation ids,
so kernels launched straight from Python (Triton, FlashInfer's FFI) count as well as torch ops.
An iteration's kernel time is the summed duration of the device activities that start within
that span. The L2 flush is launched outside every range and runs before the span opens, so it
never counts. With "both", the events are taken in a pass of their own, before the profiled
pass, so the profiler's host overhead never reaches them. Before every start event the GPU
spins (`torch.cuda._sleep`) while the host launches the call, so events time the kernels and
not Python's launch latency. (Attributing through `FunctionEvent.kernels` was tried and
rejected: it misses kernels launched outside a torch op, and on torch 2.11 it attaches kernels
to unrelated CPU events whose ids collide with the op's.)
"""

from __future__ import annotations

import bisect
import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

RANGE = "dsv4bench::run"
TIMERS = ("events", "profiler", "both")
DEFAULT_L2_BYTES = 256 * 2**20  # when torch does not report the L2 size
AGREEMENT = 0.05  # events and profiler medians "agree" within this fraction
SPIN_CYCLES = 400_000  # GPU spin before each start event: ~0.2 ms, longer than a launch


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not samples:
        return math.nan
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples_ms: Sequence[float], method: str) -> dict:
    samples = [float(x) for x in samples_ms]
    return {
        "median_ms": percentile(samples, 50),
        "p10_ms": percentile(samples, 10),
        "p90_ms": percentile(samples, 90),
        "n": len(samples),
        "method": method,
        "samples_ms": samples,
    }


def measure(
    fn: Callable[[], Any],
    *,
    device,
    warmup: int = 3,
    iters: int = 20,
    flush_l2: bool = True,
    timer: str = "events",
) -> dict:
    """Time `fn` `iters` times after `warmup` calls; see the module docstring for the method."""
    import torch

    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, not {timer!r}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, not {iters}")
    dev = torch.device(device)
    if dev.type != "cuda":
        return _measure_cpu(fn, warmup, iters)
    with torch.cuda.device(dev):
        return _measure_cuda(fn, dev, warmup, iters, flush_l2, timer)


def _measure_cpu(fn: Callable[[], Any], warmup: int, iters: int) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summarize(samples, "perf_counter")


def l2_flush_bytes(dev) -> int:
    """Twice the L2 size, so one write of the buffer leaves nothing of fn's data in L2."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)
    return 2 * l2 if l2 else DEFAULT_L2_BYTES


def _measure_cuda(fn, dev, warmup: int, iters: int, flush_l2: bool, timer: str) -> dict:
    import torch

    flush_buf = None
    if flush_l2:
        flush_buf = torch.empty(l2_flush_bytes(dev) // 4, dtype=torch.int32, device=dev)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(dev)

    if timer == "events":
        events_ms = _timed_iterations(fn, flush_buf, iters, annotate=False)
        method = "cuda-events+l2flush" if flush_l2 else "cuda-events"
        return summarize(events_ms, method)

    from torch.profiler import ProfilerActivity, profile

    # events first, on their own: the profiler's host overhead must not reach them
    events_ms = _timed_iterations(fn, flush_buf, iters, annotate=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _timed_iterations(fn, flush_buf, iters, annotate=True)
    kernel_ms = profiler_kernel_ms(prof.events())
    suffix = "+l2flush" if flush_l2 else ""
    if timer == "profiler":
        result = summarize(kernel_ms, "cuda-profiler" + suffix)
        result["events_ms"] = percentile(events_ms, 50)
    else:
        result = summarize(events_ms, "cuda-events+profiler" + suffix)
    profiler_ms = percentile(kernel_ms, 50) if kernel_ms else None
    ratio = _ratio(percentile(events_ms, 50), profiler_ms)
    result["profiler_ms"] = profiler_ms
    result["profiler_samples_ms"] = kernel_ms
    result["events_vs_profiler"] = ratio
    result["events_agree"] = None if ratio is None else abs(ratio - 1) <= AGREEMENT
    return result


def _timed_iterations(fn, flush_buf, iters: int, annotate: bool) -> list[float]:
    """Per iteration: flush L2, event, fn (inside RANGE if annotate), event. One sync at the end."""
    import torch

    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for start, end in pairs:
        if flush_buf is not None:
            flush_buf.zero_()
        # keep the GPU busy while the host launches fn, so the events time the kernels and
        # not the launch latency (engines replay decode in CUDA graphs, where none is paid)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        if annotate:
            with torch.profiler.record_function(RANGE):
                fn()
        else:
            fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def _ratio(events_ms: float, profiler_ms: float | None) -> float | None:
    if not profiler_ms or math.isnan(events_ms):
        return None
    return events_ms / profiler_ms


def profiler_kernel_ms(function_events: Iterable) -> list[float]:
    """Per RANGE occurrence, in time order: summed duration (ms) of the GPU work inside it.

    Reads torch.profiler FunctionEvents: device-side events named RANGE give the spans; every
    other device-side event that is not a user annotation is a kernel, memcpy or memset.
    """
    spans, activities = [], []
    for e in function_events:
        if getattr(e.device_type, "name", str(e.device_type)) == "CPU":
            continue
        interval = (e.time_range.start, e.time_range.end)
        if e.name == RANGE:
            spans.append(interval)
        elif not getattr(e, "is_user_annotation", False):
            activities.append(interval)
    return [us / 1e3 for us in time_in_spans(spans, activities)]


def time_in_spans(
    spans: Sequence[tuple[float, float]], activities: Iterable[tuple[float, float]]
) -> list[float]:
    """Sum the durations of activities (start, end) into the span (start, end) that contains
    their start; spans are returned in start order and do not overlap (one per timed call)."""
    ordered = sorted(spans)
    starts = [lo for lo, _ in ordered]
    totals = [0.0] * len(ordered)
    for start, end in activities:
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and start <= ordered[i][1]:
            totals[i] += end - start
    return totals


def poison(*tensors) -> None:
    """Fill tensors in place with values no correct kernel writes: NaN for floating dtypes;
    the dtype's minimum + 1 for signed integers (far from any index or -1, and its negation is
    still representable); the maximum for unsigned ones. None and bool tensors are skipped."""
    import torch

    for t in tensors:
        if t is None or t.dtype == torch.bool:
            continue
        if t.is_floating_point() or t.is_complex():
            t.fill_(math.nan)
        else:
            info = torch.iinfo(t.dtype)
            t.fill_(info.min + 1 if info.min < 0 else info.max)
