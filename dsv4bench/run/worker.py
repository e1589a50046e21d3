"""The worker process: runs (case, backend) jobs sent by the runner, one JSON line each way.

Requests arrive on stdin; each answer is one stdout line starting with MARK (kernel libraries
may print to stdout too). stderr goes to a file the runner reads when this process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace

MARK = "@@dsv4bench@@ "
PARENT_ENV = "DSV4BENCH_RUNNER_PID"  # the runner's pid: a worker never outlives it
PARENT_POLL_S = 0.5


def die_with_parent() -> None:
    """End this process when the runner ends, however it ends (SIGKILL included): Linux's
    parent-death signal, and a thread that watches the parent pid where that is missing (other
    systems) or came too late (the runner died before this process asked for it)."""
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


class Cache:
    """The last case's inputs and expected outputs: backends of one case share them."""

    def __init__(self) -> None:
        self.key = None
        self.inputs: dict = {}
        self.fingerprint = ""
        self.expected: dict = {}
        self.locality: dict = {}


# inputs from this size are dropped after their job: another build's worker makes its own
RELEASE_BYTES = 1 << 30


def release(cache: Cache, limit: int = RELEASE_BYTES) -> None:
    """What an idle worker keeps on the GPU between jobs: the last case's inputs only when
    they are small, and none of the allocator's cached blocks. The runner keeps up to three
    workers alive a GPU (run/slot.py); each holding a V3.2 batch-128 case and its cached
    blocks (22-26 GiB) left the next 5.7 GiB of an H100's 79 (three `oom` rows in
    results/sm90/studies/triton-shapes before this)."""
    import torch

    if held_bytes(cache.inputs) >= limit:
        cache.key, cache.inputs, cache.expected, cache.locality = None, {}, {}, {}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def check(case, backend, arch: str, cache: Cache) -> tuple[dict, object | None]:
    """check_row's row as a dict (what a results file holds), and the Prepared call."""
    row, prepared = check_row(case, backend, arch, cache)
    return row.to_dict(), prepared


def check_row(case, backend, arch: str, cache: Cache):
    """Everything before timing: the verdict, the provider, inputs, the oracle's answer and the
    correctness run. Returns the row so far (a CaseRow, checked at each step) and the Prepared
    call (None if unsupported)."""
    from dsv4bench import env
    from dsv4bench.backends import Unsupported
    from dsv4bench.rows import CaseRow

    row = CaseRow.of(case, backend, status="error", env=env.collect())
    reason = backend.supports(case, arch)
    if reason:
        return replace(row, status="unsupported", message=reason), None
    try:
        prov = backend.provider()
    except Unsupported as e:
        return replace(row, status="unsupported", message=str(e)), None
    provider = {"name": prov.name, "version": prov.version, "location": prov.location}
    row = replace(row, provider=provider)
    device = "cpu" if arch == "cpu" else "cuda"
    reading = _inputs_and_expected(case, backend, arch, device, cache)
    row = replace(row, input_fingerprint=cache.fingerprint)
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    try:
        if case.graph_batch:  # replayed in a graph captured at a padded batch
            from dsv4bench.run import padded

            prepared = padded.prepare(backend, case, cache.inputs, device, arch)
        else:
            prepared = backend.prepare(case, cache.inputs, device)
    except Unsupported as e:
        return replace(row, status="unsupported", message=str(e)), None
    info = dict(prepared.info)
    if cache.locality:
        info["locality"] = cache.locality
    row = replace(row, info=info, scale_reading=reading)
    if prepared.poison is not None:
        prepared.poison()
    actual = prepared.finish(prepared.run())
    if device == "cuda":
        torch.cuda.synchronize()
        row = replace(row, info={**row.info, "memory": memory(cache.inputs)})
    row = _judged(row, case, backend, prepared, actual, cache, reading)
    return _checks(row, case, backend, prepared, actual, cache, device), prepared


def _inputs_and_expected(case, backend, arch: str, device: str, cache: Cache) -> str | None:
    """The case's inputs and the oracle's answer in `cache` (shared by the backends of one
    case); returns how the backend reads V3.2 fp32 scales (None: exactly)."""
    from dsv4bench.cases import inputs
    from dsv4bench.cases.oracle import oracle_call
    from reference.layout_table import LAYOUTS

    if cache.key != case.case_id:
        cache.key, cache.inputs, cache.expected = None, {}, {}
        cache.inputs = inputs.make_inputs(case, device)
        cache.fingerprint = inputs.fingerprint(cache.inputs)
        cache.locality = index_locality(case, cache.inputs)
        cache.key = case.case_id
    # fp32 scales (V3.2) are read differently per arch; ue8m0 ones exactly everywhere
    fp32_scales = (
        LAYOUTS.get(case.layout) is not None and LAYOUTS[case.layout].scale_format == "fp32"
    )
    reading = backend.v32_scale_reading(arch) if fp32_scales else None
    if reading not in cache.expected:
        cache.expected[reading] = oracle_call(case, cache.inputs, reading)()
    return reading


def _judged(row, case, backend, prepared, actual, cache: Cache, reading):
    """The row with its accuracy and status: the oracle's own answer is a timing baseline;
    every other answer is judged (measure.judge) against the oracle."""
    from dsv4bench.cases.oracle import oracle_call
    from dsv4bench.measure import judge, metrics

    if backend.is_oracle:  # its answer is `expected` itself: no accuracy to measure
        info = {**row.info, "reference_row": "the oracle itself: a timing baseline, no accuracy"}
        return replace(row, status="ok", message="", info=info)
    expected = cache.expected[reading]
    info = dict(row.info)
    if case.op == "topk":  # picks in an engine's form, judged by the scores they select
        from dsv4bench.measure import topk

        acc = topk.compare_forms(case, cache.inputs, expected, actual)
    else:
        acc = metrics.accuracy(expected, actual)  # against the original cache
    if _has_max_logits(expected) and not _has_max_logits(actual):
        info["max_logits"] = NO_MAX_LOGITS  # accuracy compares what both sides have
    if prepared.reads is not None:  # the adapter converted the cache: both errors kept
        on_reads = oracle_call(case, prepared.reads, reading)()
        info["conversion"] = _figures(metrics.accuracy(expected, on_reads))
        info["kernel_own"] = _figures(metrics.accuracy(on_reads, actual))
        info["judged_on"] = JUDGED_ON_CACHE
    if case.op == "indexer":  # top-k judged by the scores it selects (ties), not indices
        from dsv4bench.measure import topk

        expected = cache.expected[reading]
        acc.update(
            topk.compare_topk(expected.out, expected.topk, actual.topk, actual_logits=actual.out)
        )
    if prepared.exact is not None:  # the kernel against what it claims to compute
        own = metrics.accuracy(prepared.exact(), actual)
        acc.update({f"exact_{k}": own[k] for k in EXACT_KEYS if k in own})
    tolerance = row_tolerance(case, backend)
    declared = backend.declared_tolerance(case)
    if declared:
        info["tolerance_from"] = declared[1]
    status, why = judge.verdict(acc, tolerance)
    tol = tolerance.to_row()
    return replace(row, accuracy=acc, tolerance=tol, status=status, message=why, info=info)


# What a row whose backend converts the cache (Prepared.reads) is judged on: its accuracy is
# against the original cache, the one an engine serving that cache gets.
JUDGED_ON_CACHE = (
    "the original cache (what an engine serving it gets); info.kernel_own: against the values "
    "the adapter converted it to, info.conversion: the conversion alone"
)


NO_MAX_LOGITS = "not judged: the backend returns no max_logits (the oracle has one)"


def _has_max_logits(output) -> bool:
    return getattr(output, "max_logits", None) is not None


def _figures(acc: dict) -> dict:
    return {k: acc[k] for k in ("cos_diff", "max_abs", "max_rel", "lse_max_abs")}


# the distance to the kernel's own model a row keeps (metrics.beyond_exact judges them)
EXACT_KEYS = (
    "cos_diff",
    "max_abs",
    "max_rel",
    "lse_max_abs",
    "nonfinite",
    "lse_mismatch",
    "max_logits_max_abs",
    "max_logits_mismatch",
)


def row_tolerance(case, backend):
    """The tolerance a row is judged with: the backend's declared one, else the case's."""
    declared = backend.declared_tolerance(case)
    return declared[0] if declared else case.tolerance


def _checks(row, case, backend, prepared, actual, cache: Cache, device: str):
    """The row with the optional checks (determinism, batch invariance) and how far the V3.2
    scale reading alone moves the answer."""
    from dsv4bench.backends import Unsupported
    from dsv4bench.cases.oracle import oracle_call
    from dsv4bench.measure import invariance, metrics

    acc = dict(row.accuracy or {})
    if case.timing.determinism:
        acc["determinism"] = invariance.determinism(prepared)
    if case.timing.batch_invariance:
        try:
            inv = invariance.batch_invariance(backend, case, cache.inputs, actual, device)
        except Unsupported as e:
            inv = {"error": f"a request alone is unsupported: {e}"}
        acc["batch_invariance"] = inv
    if case.timing.determinism or case.timing.batch_invariance:
        row = replace(row, accuracy=acc, tolerance=row_tolerance(case, backend).to_row())
    reading = row.scale_reading
    if reading and not backend.is_oracle:  # how far the reading alone moves the answer
        if None not in cache.expected:
            cache.expected[None] = oracle_call(case, cache.inputs, None)()
        exact = metrics.accuracy(cache.expected[None], actual)
        info = {**row.info, "vs_exact_scales": {k: exact[k] for k in ("cos_diff", "max_abs")}}
        row = replace(row, info=info)
    return row


def index_locality(case, x: dict) -> dict:
    """How local each index set of an attention case is (cases/patterns.locality)."""
    from dsv4bench.cases import patterns

    if case.op not in ("decode", "prefill"):
        return {}
    sets = {k: x[k] for k in ("indices", "extra_indices") if x.get(k) is not None}
    return {k: patterns.locality(v, case.page_size) for k, v in sets.items()}


def held_bytes(x: dict) -> int:
    """Bytes of the tensors among a case's inputs."""
    import torch

    return sum(t.numel() * t.element_size() for t in x.values() if isinstance(t, torch.Tensor))


def memory(x: dict) -> dict:
    """GPU memory of one call: its inputs, and the peak while the backend prepared and ran it
    once (inputs and the oracle's answer resident)."""
    import torch

    return {
        "inputs_mib": round(held_bytes(x) / 2**20, 1),
        "peak_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
    }


def run_job(job: dict, cache: Cache) -> dict:
    """One job's row, as the dict the runner reads."""
    from dsv4bench import backends
    from dsv4bench.cases.case import Case
    from dsv4bench.measure import hardware, metrics, split, timing

    case = Case.from_dict(job["case"])
    arch = job["arch"]
    if arch == "cpu":
        _one_cpu_thread()
    backend = backends.get(job["backend"])
    row, prepared = check_row(case, backend, arch, cache)
    if prepared is None or row.status != "ok":  # a wrong answer's speed means nothing
        return row.to_dict()
    device = "cpu" if arch == "cpu" else "cuda"
    t = case.timing
    timer = t.timer
    if backend.is_oracle and timer == "both":
        # a reference row times the host-bound oracle (~60 launches a call): its profiler pass
        # (another `iters` calls plus parsing thousands of events) ranked nothing and took half
        # of a sweep's oracle time; events alone are its baseline figure
        timer = "events"
        row = replace(row, info={**row.info, "timer": "events only: the oracle ranks nothing"})
    how = dict(
        device=device,
        warmup=t.warmup,
        iters=t.iters,
        flush_l2=t.flush_l2,
        timer=timer,
        graph=t.graph and not case.graph_batch,  # a graph-pad call is a replay already
    )
    measured = timing.measure(prepared.run, **how)
    if prepared.logits is not None:  # the indexer: its logits alone, so the row splits
        measured["split"] = split.split(measured, timing.measure(prepared.logits, **how))
    padded = row.info.get("padded_heads")
    precision = row.info.get("compute_precision", "bf16")
    derived = metrics.derived(case, measured, hardware.detect(device), padded, precision)
    return replace(row, timing=measured, derived=derived).to_dict()


def _one_cpu_thread() -> None:
    """CPU timings use one thread: on a small shared machine (CI's 2 cores) a busy neighbour
    stalls every barrier of a multi-threaded op, turning 1 ms into 100 ms; one thread only ever
    waits its turn, so contention slows a case by about the load, which compare's noise model
    can bound."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


HOST_OOM = ("can't allocate memory", "cannot allocate memory")  # torch's CPU allocator, errno 12


TRACEBACK_FRAMES = 8  # the innermost: where it was raised (the kernel's code or the adapter)


def raised_where(exc: BaseException) -> str:
    """The traceback of `exc` cut to its innermost frames, chained causes included: the
    outermost frames are the worker's own loop, the same for every job."""
    return "".join(traceback.format_exception(exc, limit=-TRACEBACK_FRAMES))


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__:
        return "oom"
    if "out of memory" in text.lower() or any(m in text.lower() for m in HOST_OOM):
        return "oom"
    if "CUDA error" in text or "cudaError" in text or "device-side assert" in text:
        return "crash"
    if type(exc).__name__ == "CaptureFailed":  # run/padded.py: the process is unfit afterwards
        return "crash"
    return "error"


def main() -> int:
    from dsv4bench import backends

    die_with_parent()
    setup = json.loads(sys.stdin.readline())
    backends.setup(setup.get("plugins", []), setup.get("instances", []))
    print(MARK + json.dumps({"ready": True}), flush=True)
    cache = Cache()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            answer = run_job(job, cache)
            # a failed graph capture leaves torch's CUDA state unfit for later jobs: start afresh
            fatal = "graph_error" in (answer.get("timing") or {})
        except BaseException as exc:  # every failure of a job becomes its result row
            status = _classify(exc)
            print(raised_where(exc), file=sys.stderr, flush=True)
            # the outcome only: the runner makes it the job's row (CaseRow.of)
            answer = {"status": status, "message": f"{type(exc).__name__}: {exc}"[:2000]}
            cache.key = None
            fatal = status == "crash"  # a CUDA error poisons the context: start afresh
        print(MARK + json.dumps(answer, default=str), flush=True)
        if fatal:
            return 3
        release(cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
