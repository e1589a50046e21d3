"""A graph-pad case (cases/edges.py) as the engine runs it: the backend prepares the captured
batch of graph_batch rows (the real ones and the engine's padding), the call is captured once
in a CUDA graph and replayed, and only the real rows are judged. The adapter's host-side
metadata (a FlashMLA schedule, a FlashInfer plan) is made in prepare() from the padded batch,
as an engine's metadata builder runs before each replay. On a CPU the padded call runs eagerly
(no graph): the padding alone is checked."""

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
    p = backend.prepare(wide, x, device)
    run = p.run
    pad = edges.PADDING[case.edge]
    info = {
        **p.info,
        "graph_padding": {
            "real_rows": case.batch_size,
            "graph_batch": case.graph_batch,
            "engine": pad.engine,
            "padded_rows_read": pad.reads,
            "source": pad.source,
            "replay": "cuda graph" if str(device).startswith("cuda") else "eager (no graph on cpu)",
        },
    }
    if str(device).startswith("cuda"):
        from dsv4bench.measure import timing

        try:
            run = timing.replayed(p.run)
        except Exception as e:  # noqa: BLE001 - every capture failure is the row's result
            raise CaptureFailed(f"capture of the padded batch: {type(e).__name__}: {e}") from e
    b = case.batch_size
    reads = None
    if p.reads is not None:  # the converted inputs, the real rows only (the oracle's case)
        reads = {
            k: (v[:b] if k in edges.ROW_KEYS and v is not None else v) for k, v in p.reads.items()
        }
    exact = None if p.exact is None else (lambda: edges.real_rows(p.exact(), b))
    return Prepared(
        run=run,
        finish=lambda raw: edges.real_rows(p.finish(raw), b),
        poison=p.poison,
        info=info,
        reads=reads,
        exact=exact,
    )
