"""The support envelope: one cell per (backend, head padding, phase, layout, heads, top-k, s_q),
each ok, unsupported (the adapter's reason, at plan time), refused (the call raised: the
kernel's or its library's own check, the process lived on), crash or incorrect. A backend's
cells with heads padded as the engine pads and with heads raw (the kernel meets them
unpadded, Case.head_padding) are two grids of their own (`grid`).

Plan time decides most cells (`Backend.supports`, CPU only); rows of a run of the same
scenario fill in the rest. The top-k axis is the width the kernel sees from the indexer: a
V3.2-style case's `topk`, a compressed-cache case's `extra_topk`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

ENVELOPE_STATUSES = ("ok", "unsupported", "refused", "crash", "incorrect", "planned")
_FAILED = {"crash", "timeout", "oom"}  # a row status the grid draws as a crash


@dataclass(frozen=True)
class Cell:
    backend: str
    arch: str
    phase: str  # the case's op: decode or prefill
    layout: str
    num_heads: int
    topk: int
    s_q: int
    status: str  # one of ENVELOPE_STATUSES; "planned": supported, not run yet
    reason: str = ""  # why unsupported or refused, or the crash / mismatch message
    case_id: str = ""
    head_padding: str = "engine"  # Case.head_padding (cells written before it: engine)


def grid(cell: Cell) -> str:
    """The grid a cell belongs to: its backend, and its head padding unless the engine's."""
    if cell.head_padding == "engine":
        return cell.backend
    return f"{cell.backend} (heads {cell.head_padding})"


def indexer_width(case) -> int:
    """The top-k axis value of a case: the compressed cache's width where there is one."""
    return case.extra_topk if case.compress_ratio else case.topk


def row_status(row: dict) -> tuple[str, str]:
    """A result row's cell status and its message."""
    status = row.get("status", "")
    message = str(row.get("message") or "")
    if status in _FAILED:
        return "crash", f"{status}: {message}".rstrip(": ")
    if status == "error":  # the call raised and the worker answered: a check, not a crash
        return "refused", message
    if status in ("ok", "unsupported", "incorrect"):
        return status, message
    raise ValueError(f"row {row.get('case_id')!r} has unknown status {status!r}")


def cells(jobs, arch: str, supports, rows: list[dict] = ()) -> list[Cell]:
    """One cell per job: its plan verdict (`supports(job) -> reason or None`), replaced by its
    row's status where `rows` has one (the last row of a (case, backend) wins)."""
    by_job = {(r["case_id"], r["backend"]): r for r in rows if r.get("kind", "case") == "case"}
    out = []
    for job in jobs:
        c = job.case
        reason = supports(job)
        status = "unsupported" if reason else "planned"
        row = by_job.get((c.case_id, job.backend))
        if row is not None:
            status, reason = row_status(row)
        out.append(
            Cell(
                job.backend, arch, c.op, c.layout, c.num_heads, indexer_width(c), c.s_q,
                status, reason or "", c.case_id, c.head_padding,
            )
        )  # fmt: skip
    return out


def write_cells(cells_: list[Cell], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for cell in cells_:
            f.write(json.dumps(asdict(cell), sort_keys=True) + "\n")


def read_cells(path: Path) -> list[Cell]:
    return [Cell(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def counts(cells_: list[Cell]) -> dict[str, dict[str, int]]:
    """grid (backend, and head padding unless the engine's) -> status -> number of cells."""
    out: dict[str, dict[str, int]] = {}
    for cell in cells_:
        by_status = out.setdefault(grid(cell), dict.fromkeys(ENVELOPE_STATUSES, 0))
        by_status[cell.status] += 1
    return out
