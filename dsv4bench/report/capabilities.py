"""Per backend: what its kernels take, derived from its declarations and `supports` answers
on probe cases, so the table follows the code. Facts no probe can find (an LSE output, CUDA
graph capture, a batch-invariant mode) come from the backend's own `capabilities` class
attribute (name -> short text), written next to its code; without one the cell says so."""

from __future__ import annotations

import dataclasses

COLUMNS = (
    "FP8 layouts", "sink", "extra cache", "topk_length", "s_q > 1", "max rows",
    "lse out", "CUDA graphs", "batch invariance",
)  # fmt: skip
DECLARED = ("lse out", "CUDA graphs", "batch invariance")
NOT_DECLARED = "not declared"


def _yes(backend, case, arch: str) -> str:
    reason = backend.supports(case, arch)
    return "yes" if reason is None else f"no ({reason})"


def capability_row(backend, probe, arch: str) -> dict[str, str]:
    """One backend's row; `probe`: a decode case of a compressed-cache model (V4) with an
    extra cache, a sink and one query token."""
    ragged = dataclasses.replace(probe, context_lens=(probe.context_len // 2, probe.context_len))
    ragged = dataclasses.replace(ragged, batch_size=2)
    layouts = backend.layouts
    guess = backend.limit_guess(probe, "batch_size", arch)
    declared = getattr(backend, "capabilities", {}) or {}
    row = {
        "FP8 layouts": "any" if layouts is None else ", ".join(layouts) or "none",
        "sink": _yes(backend, probe, arch),
        "extra cache": _yes(backend, probe, arch),
        "topk_length": _yes(backend, ragged, arch),
        "s_q > 1": _yes(backend, dataclasses.replace(probe, s_q=2), arch),
        "max rows": str(guess) if guess is not None else "no limit known",
    }
    without_sink = dataclasses.replace(probe, sink=False)
    if row["sink"] != "yes" and backend.supports(without_sink, arch) is None:
        row["sink"] = "no"
    no_extra = dataclasses.replace(probe, compress_ratio=0, extra_topk=0, sink=False)
    if row["extra cache"] != "yes" and backend.supports(no_extra, arch) is None:
        row["extra cache"] = "no"
    row.update({name: str(declared.get(name, NOT_DECLARED)) for name in DECLARED})
    return row


def table(rows: dict[str, dict[str, str]]) -> str:
    """A markdown table: one line per backend."""
    head = "| backend | " + " | ".join(COLUMNS) + " |"
    rule = "|" + "---|" * (len(COLUMNS) + 1)
    body = [
        f"| {name} | " + " | ".join(row[col].replace("|", "/") for col in COLUMNS) + " |"
        for name, row in rows.items()
    ]
    return "\n".join([head, rule, *body]) + "\n"
