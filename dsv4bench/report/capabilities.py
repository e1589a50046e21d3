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


def _answer(backend, case, baseline, arch: str) -> str:
    """yes; no (the case is refused, the baseline without the feature is not); or no with the
    reason (both refused: the probe says nothing about the feature itself)."""
    reason = backend.supports(case, arch)
    if reason is None:
        return "yes"
    return "no" if backend.supports(baseline, arch) is None else f"no ({reason})"


def capability_row(backend, probe, arch: str) -> dict[str, str]:
    """One backend's row; `probe`: a decode case of a compressed-cache model (V4) with an
    extra cache, a sink and one query token."""
    plain = dataclasses.replace(probe, sink=False)
    bare = dataclasses.replace(plain, compress_ratio=0, extra_topk=0)
    ragged = dataclasses.replace(
        plain, batch_size=2, context_lens=(probe.context_len // 2, probe.context_len)
    )
    layouts = backend.layouts
    guess = backend.limit_guess(probe, "batch_size", arch)
    declared = getattr(backend, "capabilities", {}) or {}
    return {
        "FP8 layouts": "any" if layouts is None else ", ".join(layouts) or "none",
        "sink": _answer(backend, probe, plain, arch),
        "extra cache": _answer(backend, plain, bare, arch),
        "topk_length": _answer(backend, ragged, plain, arch),
        "s_q > 1": _answer(backend, dataclasses.replace(plain, s_q=2), plain, arch),
        "max rows": str(guess) if guess is not None else "no limit known",
        **{name: str(declared.get(name, NOT_DECLARED)) for name in DECLARED},
    }


def table(rows: dict[str, dict[str, str]]) -> str:
    """A markdown table: one line per backend."""
    head = "| backend | " + " | ".join(COLUMNS) + " |"
    rule = "|" + "---|" * (len(COLUMNS) + 1)
    body = [
        f"| {name} | " + " | ".join(row[col].replace("|", "/") for col in COLUMNS) + " |"
        for name, row in rows.items()
    ]
    return "\n".join([head, rule, *body]) + "\n"
