"""A graph-pad or graph-refill case (cases/edges.py) as the engine runs it: the backend prepares
the captured batch of graph_batch rows (the real ones and the engine's padding), the call is
captured once in a CUDA graph and replayed, and only the real rows are judged. The adapter's
host-side metadata (a FlashMLA schedule, a FlashInfer plan) is made in prepare() from the padded
batch, as an engine's metadata builder runs before each replay. On a CPU the padded call runs
eagerly (no graph): the padding alone is checked.

graph-refill: the graph is captured on another batch (edges.other_batch), then the backend
prepares this batch (the metadata builder's step) and its buffers are copied into the captured
call's in place (`refill`, Prepared.buffers), as an engine copies the next step's inputs and
metadata into its static buffers; the replay is judged on this batch. Only the capture is
CUDA's: on a CPU the captured call runs eagerly after the same refill."""

from __future__ import annotations

from dsv4bench.backends.base import Prepared, Unsupported
from dsv4bench.cases import edges


class CaptureFailed(RuntimeError):
    """The padded call could not be captured: a result (an engine bug class), and a process
    not to be trusted afterwards (measure.timing.graph_times)."""


def prepare(backend, case, inputs: dict, device: str, arch: str) -> Prepared:
    wide, x = edges.padded(case, inputs)
    reason = backend.supports(wide, arch)
    if reason:
        raise Unsupported(f"the captured batch of {wide.batch_size} rows: {reason}")
    if case.edge in edges.REFILL:
        return _refilled(backend, case, inputs, (wide, x), device)
    p = backend.prepare(wide, x, device)
    return _judged_rows(p, case, p, captured(p.run, device), _padding_info(case, device))


def _refilled(backend, case, inputs: dict, this: tuple, device: str) -> Prepared:
    before_case, before = edges.other_batch(case, inputs)
    first = backend.prepare(*edges.padded(before_case, before), device)
    if first.buffers is None:
        raise Unsupported(
            f"{backend.name}'s adapter names no buffers its call reads (Prepared.buffers): "
            "the next batch cannot be copied into a captured call"
        )
    run = captured(first.run, device)  # captured on the other batch
    step = backend.prepare(*this, device)  # this batch: its inputs and metadata
    refill(first.buffers, step.buffers)
    info = _padding_info(case, device)
    info["graph_refill"] = {
        "captured_with": "another batch: each request's rows from the next one, the first "
        "request's entries halved (cases/edges.py other_batch)",
        "refilled": f"{len(first.buffers)} buffers copied in place (Prepared.buffers)",
    }
    return _judged_rows(first, case, step, run, info)


def refill(static, new) -> None:
    """Copy a prepared call's buffers (`new`) into those a captured call reads (`static`), in
    place, as an engine fills its static buffers before a replay. The two must match one to
    one: a buffer whose shape or dtype follows the batch cannot be refilled (Unsupported)."""
    if new is None or len(static) != len(new):
        got = "none" if new is None else len(new)
        raise Unsupported(
            f"the next batch's call has {got} buffers, the captured one {len(static)}"
        )
    for i, (a, b) in enumerate(zip(static, new, strict=True)):
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
            raise Unsupported(
                f"buffer {i} of the captured call is {_form(a)}, the next batch's {_form(b)}"
            )
        if a.data_ptr() != b.data_ptr():
            a.copy_(b)


def _form(t) -> str:
    return "absent" if t is None else f"{tuple(t.shape)} {t.dtype}"


def captured(run, device: str):
    """`run` replayed from a CUDA graph on a GPU; `run` itself elsewhere."""
    if not str(device).startswith("cuda"):
        return run
    from dsv4bench.measure import timing

    try:
        return timing.replayed(run)
    except Exception as e:  # noqa: BLE001 - every capture failure is the row's result
        raise CaptureFailed(f"capture of the padded batch: {type(e).__name__}: {e}") from e


def _padding_info(case, device: str) -> dict:
    pad = edges.PADDING[case.edge]
    return {
        "graph_padding": {
            "real_rows": case.batch_size,
            "graph_batch": case.graph_batch,
            "engine": pad.engine,
            "padded_rows_read": pad.reads,
            "source": pad.source,
            "replay": "cuda graph" if str(device).startswith("cuda") else "eager (no graph on cpu)",
        }
    }


def _judged_rows(runs: Prepared, case, reads: Prepared, run, info: dict) -> Prepared:
    """The captured call (`runs`: its finish and poison) with the real rows of the batch judged
    (`reads`: the operands it converted, its exact model)."""
    b = case.batch_size
    converted = None
    if reads.reads is not None:  # the converted inputs, the real rows only (the oracle's case)
        converted = {
            k: (v[:b] if k in edges.ROW_KEYS and v is not None else v)
            for k, v in reads.reads.items()
        }
    exact = None if reads.exact is None else (lambda: edges.real_rows(reads.exact(), b))
    return Prepared(
        run=run,
        finish=lambda raw: edges.real_rows(runs.finish(raw), b),
        poison=runs.poison,
        info={**runs.info, **info},
        reads=converted,
        exact=exact,
    )
