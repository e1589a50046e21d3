"""Timing a zero-argument call: CUDA events with a cold L2 on a GPU, perf_counter on a CPU.
On a GPU the warm-up calls run on until WARM_S has passed (warm_up), so the first timed calls
do not catch clocks still rising after an idle spell.

Statistics: percentiles interpolate linearly between the two nearest order statistics
(numpy's default, Hyndman-Fan type 7), so the median of an even count is the mean of the
middle two and p10/p90 of few samples stay inside the observed range.

Profiler kernel time (timer "profiler" or "both"): every timed call runs inside
`torch.profiler.record_function(RANGE)`. For such a range the profiler (kineto) also emits a
device-side event of the same name spanning, on the GPU timeline, the GPU work launched inside
the range: it links each kernel, memcpy or memset to its launch through CUPTI correlation ids,
so kernels launched straight from Python (Triton, FlashInfer's FFI) count as well as torch ops.
An iteration's kernel time is the makespan of the device activities that start within that
span: from the first one's start to the last one's end. It counts kernels that overlap
(programmatic dependent launch lets the next kernel start before the previous one ends) once,
where a plain sum counts them twice, and it counts the gaps between one call's kernels, which
CUDA events see too. Beside it: `profiler_busy_ms` (the union of the intervals: time some
kernel ran), `profiler_sum_ms` (the plain sum) and a per-kernel breakdown (`kernels`: name,
launches and time per call).
The L2 flush is launched outside every range and runs before the span opens, so it never
counts. With "both", the events are taken in a pass of their own, before the profiled pass,
so the profiler's host overhead never reaches them. Before every start event the GPU spins
(`torch.cuda._sleep`) while the host launches the call, so events time the kernels and not
Python's launch latency. (Attributing through `FunctionEvent.kernels` was tried and rejected:
it misses kernels launched outside a torch op, and on torch 2.11 it attaches kernels to
unrelated CPU events whose ids collide with the op's.)
"""

from __future__ import annotations

import bisect
import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dsv4bench.cases.case import TIMER_MODES

RANGE = "dsv4bench::run"
DEFAULT_L2_BYTES = 256 * 2**20  # when torch does not report the L2 size
AGREEMENT = 0.05  # events and profiler medians "agree" within this fraction
# GPU spin before each start event, ~1 ms: longer than the host takes to launch a call of
# several Python-launched kernels under the profiler (0.2 ms was not: Triton's attention and
# combine kernels then ran up to 0.09 ms apart, a gap the makespan counted)
SPIN_CYCLES = 2_000_000
WARM_S = 0.03  # a GPU's warm-up runs on to this long: its clocks settle after an idle spell
WARM_MAX_CALLS = 200  # ... but never more calls than this past the requested warm-up


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
    graph: bool = False,
) -> dict:
    """Time `fn` `iters` times after `warmup` calls; see the module docstring for the method.

    On a GPU the result also holds `memory` (see memory_per_call) and, with graph=True, the
    CUDA-graph replay times (see graph_times) beside the eager ones."""
    import torch

    if timer not in TIMER_MODES:
        raise ValueError(f"timer must be one of {', '.join(TIMER_MODES)}, not {timer!r}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, not {iters}")
    dev = torch.device(device)
    if dev.type != "cuda":
        return _measure_cpu(fn, warmup, iters)
    with torch.cuda.device(dev):
        result = _measure_cuda(fn, dev, warmup, iters, flush_l2, timer)
        result["memory"] = memory_per_call(fn, dev)
        if graph:
            result.update(graph_times(fn, dev, iters, flush_l2))
        return result


def warm_up(
    fn: Callable[[], Any],
    calls: int,
    sync: Callable[[], Any],
    min_s: float = WARM_S,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Call fn `calls` times and, when calls > 0, on (synchronized, at most WARM_MAX_CALLS
    more) until min_s has passed since the first: measured on an H100, a 0.56 ms kernel ran
    0.69-1.74 ms for its first 11 timed calls after 3 warm-up calls (results/sm90/
    studies/own-kernels/indexer/NOTES.md). Returns the calls made."""
    t0 = clock()
    for _ in range(calls):
        fn()
    sync()
    made = calls
    while calls and clock() - t0 < min_s and made < calls + WARM_MAX_CALLS:
        fn()
        sync()
        made += 1
    return made


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
    warm_up(fn, warmup, lambda: torch.cuda.synchronize(dev))

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
    spans, activities = profiler_activities(prof.events())
    kernel_ms = [us / 1e3 for us in time_in_spans(spans, activities)]
    busy_ms = [us / 1e3 for us in time_in_spans(spans, activities, how="union")]
    summed_ms = [us / 1e3 for us in time_in_spans(spans, activities, how="sum")]
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
    result["profiler_busy_ms"] = percentile(busy_ms, 50) if busy_ms else None
    result["profiler_sum_ms"] = percentile(summed_ms, 50) if summed_ms else None
    result["kernels"] = kernel_breakdown(spans, activities)
    result["events_vs_profiler"] = ratio
    result["events_agree"] = None if ratio is None else abs(ratio - 1) <= AGREEMENT
    return result


def memory_per_call(fn: Callable[[], Any], dev) -> dict:
    """Device memory one call takes beyond what existed before it (inputs, preallocated outputs,
    workspaces made in prepare): `scratch_bytes`, the peak above what the call leaves allocated,
    and `output_bytes`, what it leaves allocated (outputs it allocates itself). Counts the torch
    caching allocator's tensors: memory a library takes with its own cudaMalloc is not seen."""
    import torch

    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    out = fn()
    torch.cuda.synchronize(dev)
    kept = torch.cuda.memory_allocated(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    del out
    return {"scratch_bytes": max(0, peak - kept), "output_bytes": max(0, kept - base)}


def capture_graph(fn: Callable[[], Any]):
    """fn captured once into a CUDA graph (after a warm-up call on a side stream, as
    torch.cuda.graphs requires); raises what the capture raised."""
    return captured(fn)[0]


def captured(fn: Callable[[], Any]):
    """(graph, what fn returned while captured): the replay rewrites the latter in place."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def replayed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn captured once (capture_graph); a call replays the graph and returns the captured
    call's outputs, as an engine reads a replayed batch."""
    graph, out = captured(fn)

    def replay():
        graph.replay()
        return out

    return replay


def graph_times(fn: Callable[[], Any], dev, iters: int, flush_l2: bool = True) -> dict:
    """fn as engines run decode: captured once, replayed. Returns `graph_ms` (events median of
    replays, timed like the eager call), and back-to-back host loops of the eager call and of
    the replay (`eager_loop_ms`, `graph_loop_ms`, warm L2): their difference is the launch
    overhead a graph removes. A capture that fails gives `graph_error` with its message; the
    process is not to be trusted afterwards (torch's CUDA generator can stay in capture mode:
    "Offset increment outside graph capture"), so the worker starts afresh after such a row."""
    import torch

    try:
        graph = capture_graph(fn)
    except Exception as e:  # a capture failure is a result (an engine bug class), not a crash
        result = {"graph_error": f"{type(e).__name__}: {e}"[:1000]}
        try:
            torch.cuda.synchronize(dev)
        except Exception:
            result["context_lost"] = True
        return result
    flush_buf = None
    if flush_l2:
        flush_buf = torch.empty(l2_flush_bytes(dev) // 4, dtype=torch.int32, device=dev)
    graph.replay()
    samples = _timed_iterations(graph.replay, flush_buf, iters, annotate=False)
    del flush_buf
    return {
        "graph_ms": percentile(samples, 50),
        "graph_samples_ms": samples,
        "eager_loop_ms": _loop_ms(fn, dev, iters),
        "graph_loop_ms": _loop_ms(graph.replay, dev, iters),
    }


def _loop_ms(fn: Callable[[], Any], dev, iters: int) -> float:
    """Host wall time per call of `iters` back-to-back calls (one sync at the end)."""
    import torch

    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize(dev)
    return (time.perf_counter() - t0) * 1e3 / iters


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


def profiler_activities(function_events: Iterable) -> tuple[list, list]:
    """(spans, activities) from torch.profiler FunctionEvents, times in microseconds.

    Device-side events named RANGE give the spans (start, end); every other device-side event
    that is not a user annotation is a kernel, memcpy or memset: (start, end, name)."""
    spans, activities = [], []
    for e in function_events:
        if getattr(e.device_type, "name", str(e.device_type)) == "CPU":
            continue
        if e.name == RANGE:
            spans.append((e.time_range.start, e.time_range.end))
        elif not getattr(e, "is_user_annotation", False):
            activities.append((e.time_range.start, e.time_range.end, e.name))
    return spans, activities


def profiler_kernel_ms(function_events: Iterable) -> list[float]:
    """Per RANGE occurrence, in time order: the makespan (ms) of the GPU work inside it."""
    return [us / 1e3 for us in time_in_spans(*profiler_activities(function_events))]


def _assign(spans: Sequence[tuple[float, float]], activities: Iterable[Sequence]) -> list[list]:
    """Activities grouped by the span (in start order) that contains their start."""
    ordered = sorted(spans)
    starts = [lo for lo, _ in ordered]
    groups: list[list] = [[] for _ in ordered]
    for act in activities:
        i = bisect.bisect_right(starts, act[0]) - 1
        if i >= 0 and act[0] <= ordered[i][1]:
            groups[i].append(act)
    return groups


def union_length(intervals: Iterable[Sequence[float]]) -> float:
    """Length of the union of intervals (start, end, ...): overlaps and nesting count once."""
    total, reach = 0.0, -math.inf
    for start, end, *_ in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def makespan(intervals: Iterable[Sequence[float]]) -> float:
    """From the first interval's start to the last one's end (0 for none)."""
    items = list(intervals)
    if not items:
        return 0.0
    return max(i[1] for i in items) - min(i[0] for i in items)


SPAN_MEASURES = {
    "makespan": makespan,
    "union": union_length,
    "sum": lambda g: sum(a[1] - a[0] for a in g),
}


def time_in_spans(
    spans: Sequence[tuple[float, float]],
    activities: Iterable[Sequence],
    *,
    how: str = "makespan",
) -> list[float]:
    """Per span (start order; spans do not overlap, one per timed call), the time of the
    activities (start, end, ...) that start inside it, in the unit given: their makespan, the
    length of their union, or the plain sum of their durations (SPAN_MEASURES)."""
    measure = SPAN_MEASURES[how]
    return [measure(g) for g in _assign(spans, activities)]


def kernel_breakdown(
    spans: Sequence[tuple[float, float]], activities: Iterable[Sequence], top: int = 8
) -> list[dict]:
    """The kernels inside the spans: name, launches per call and mean ms per call, longest
    first (at most `top`; the rest summed as "(other)")."""
    groups = _assign(spans, activities)
    if not groups:
        return []
    per_name: dict[str, list[float]] = {}
    for group in groups:
        for start, end, name in group:
            per_name.setdefault(name, [0, 0.0])
            per_name[name][0] += 1
            per_name[name][1] += end - start
    n = len(groups)
    rows = [
        {"name": name, "count": count / n, "ms": total * 1e-3 / n}
        for name, (count, total) in per_name.items()
    ]
    rows.sort(key=lambda r: -r["ms"])
    if len(rows) > top:
        rest = rows[top - 1 :]
        rows = rows[: top - 1] + [
            {
                "name": "(other)",
                "count": sum(r["count"] for r in rest),
                "ms": sum(r["ms"] for r in rest),
            }
        ]
    return rows


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
