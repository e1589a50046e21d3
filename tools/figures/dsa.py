"""Figures of the dsa-helpers study: the engines' DSA helper ops against the own Triton ones."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from .common import STUDIES, _last_rows, _pair_ratios, span

DSA = f"{STUDIES}/dsa-helpers/run"
DSA_NEW = f"{STUDIES}/dsa-helpers/run-5fe1f86"


def _dsa_statuses(run: str = DSA) -> str:
    n = Counter(r["status"] for r in _last_rows(run))
    return ", ".join(f"{n[k]} {k}" for k in ("ok", "incorrect", "error", "unsupported"))


def _dsa_span(a: str, op: str, b: str = "triton", run: str = DSA) -> str:
    """a's time / b's on the dsa-helpers cases of `op` both ran ok (n pairs)."""
    r = _pair_ratios(run, a, b, op=op)
    return f"{span(r)} ({len(r)} cases)" if len(r) > 1 else f"{r[0]:.2f} (1 case)"


def _dsa_same_verdicts(backend: str) -> str:
    """Jobs of `backend` in both dsa-helpers runs whose status and differing bytes/values agree,
    of those in both (the pruned _C of DSA_NEW against the unpruned one of DSA)."""
    old = {(r["case_id"], r["backend"]): r for r in _last_rows(DSA)}

    def verdict(r):
        acc = r.get("accuracy") or {}
        return r["status"], acc.get("bytes_differ"), acc.get("mismatched")

    both = [(old[k], r) for r in _last_rows(DSA_NEW) if (k := (r["case_id"], r["backend"])) in old]
    both = [(o, n) for o, n in both if n["backend"] == backend]
    return f"{sum(verdict(o) == verdict(n) for o, n in both)} of {len(both)}"


def _dsa_cache_differ(backend: str) -> str:
    """Differing bytes / bytes of the records written, per incorrect cache_write row."""
    out = []
    for r in _last_rows(DSA):
        if r["backend"] == backend and r["op"] == "cache_write" and r["status"] == "incorrect":
            p = r["params"]
            written = p["batch_size"] * p["s_q"] * 656  # V3.2's 656-byte record per token
            out.append(f"{r['accuracy']['bytes_differ']} of {written}")
    return ", ".join(sorted(out))


FIGURES: dict[str, Callable[[], str]] = {
    "dsa_statuses": _dsa_statuses,
    "dsa_vllm_dequant": lambda: _dsa_span("vllm-ops-0.33.0", "dequant"),
    "dsa_sglang_dequant": lambda: _dsa_span("sglang-ops-0.5.23", "dequant"),
    "dsa_vllm_topk": lambda: _dsa_span("vllm-ops-0.33.0", "topk"),
    "dsa_persistent_topk": lambda: _dsa_span("vllm-persistent-topk", "topk"),
    "dsa_cooperative_topk": lambda: _dsa_span("vllm-cooperative-topk", "topk"),
    "dsa_vllm_remap": lambda: _dsa_span("vllm-triton-0.33.0", "remap"),
    "dsa_sglang_remap": lambda: _dsa_span("sglang-ops-0.5.23", "remap"),
    "dsa_sglang_page_split": lambda: _dsa_span("sglang-ops-0.5.23", "page_split"),
    "dsa_cache_differ": lambda: _dsa_cache_differ("vllm-ops-0.33.0"),
    "dsa_new_statuses": lambda: _dsa_statuses(DSA_NEW),
    "dsa_pruned_same": lambda: _dsa_same_verdicts("vllm-ops-0.33.0"),
    "dsa_v4_gather": lambda: _dsa_span("vllm-v4-cache-0.33.0", "dequant", run=DSA_NEW),
    "dsa_v41_gather": lambda: _dsa_span("vllm-v41-cache-0.33.0", "dequant", run=DSA_NEW),
    "dsa_one_pass_gather": lambda: _dsa_span(
        "vllm-v41-cache-one-pass-0.33.0", "dequant", run=DSA_NEW
    ),
}
