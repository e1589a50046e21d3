"""Per backend: what its kernels take, derived from its declarations and `supports` answers
on probe cases, so the table follows the code. Facts no probe can find (an LSE output, CUDA
graph capture, a batch-invariant mode) come from the backend's own `capabilities` class
attribute (name -> short text), written next to its code; without one the cell says so.
Where rows of a run measured one of them (a CUDA-graph replay, a batch-invariance check, an
lse judged), the measurement wins, and each such cell says which it is."""

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


def capability_row(backend, probe, arch: str, rows=()) -> dict[str, str]:
    """One backend's row; `probe`: a decode case of a compressed-cache model (V4) with an
    extra cache, a sink and one query token; `rows`: result rows whose measurements win."""
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
        **{name: _declared(declared, name) for name in DECLARED},
        **measured(rows, getattr(backend, "name", "")),
    }


def _declared(declared: dict, name: str) -> str:
    return f"{declared[name]} (declared)" if name in declared else NOT_DECLARED


def _timing(row: dict) -> dict:
    return row.get("timing") or {}


def measured(rows, name: str) -> dict[str, str]:
    """The DECLARED columns the rows of backend `name` measured: CUDA graphs from graph
    replays (timing graph_ms / graph_error, and graph-pad rows), batch invariance from the
    batch_invariance check, lse out from rows whose lse was judged."""
    mine = [r for r in rows if r.get("backend") == name]
    out = {}
    replays = [r for r in mine if "graph_ms" in _timing(r)]
    padded = [r for r in mine if (r.get("params") or {}).get("graph_batch")]
    failed = [r for r in mine if "graph_error" in _timing(r)]
    failed += [r for r in padded if r.get("status") in ("crash", "error", "timeout")]
    if failed:
        why = _timing(failed[0]).get("graph_error") or failed[0].get("message") or ""
        out["CUDA graphs"] = f"fails in {len(failed)} rows, e.g. {why[:80]} (measured)"
    elif replays or any(r.get("status") in ("ok", "incorrect") for r in padded):
        # a graph-refill row an adapter refused (no Prepared.buffers) was never captured
        n = len(replays) + sum(r.get("status") in ("ok", "incorrect") for r in padded)
        out["CUDA graphs"] = f"yes: {n} rows captured and replayed (measured)"
    checks = [(r.get("accuracy") or {}).get("batch_invariance") for r in mine]
    checks = [c for c in checks if isinstance(c, dict) and "max_ulps" in c]
    if checks:
        worst = max(c["max_ulps"] or 0 for c in checks)
        verdict = "yes" if worst == 0 else f"no: up to {worst} ulps"
        out["batch invariance"] = f"{verdict} in {len(checks)} rows (measured)"
    judged = [r for r in mine if (r.get("accuracy") or {}).get("lse_max_abs") is not None]
    if judged:
        out["lse out"] = f"yes: judged in {len(judged)} rows (measured)"
    return out


def table(rows: dict[str, dict[str, str]]) -> str:
    """A markdown table: one line per backend."""
    head = "| backend | " + " | ".join(COLUMNS) + " |"
    rule = "|" + "---|" * (len(COLUMNS) + 1)
    body = [
        f"| {name} | " + " | ".join(row[col].replace("|", "/") for col in COLUMNS) + " |"
        for name, row in rows.items()
    ]
    return "\n".join([head, rule, *body]) + "\n"
