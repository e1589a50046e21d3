"""Plan-time size check: a case whose inputs and outputs alone exceed what any GPU holds is a
scenario error naming the bytes, not an `oom` row after a worker tried to allocate them; one
that exceeds this machine's memory (its RAM for the CPU oracle, its GPU's) is refused by `run`
(`machine_problem`)."""

from __future__ import annotations

from typing import Any

from reference.layout_table import LAYOUTS as LAYOUT_TABLE

# The largest memory of any GPU (NVIDIA B300: 288 GB of HBM3e). Only the bytes a case cannot do
# without are counted (q, the cache, out, indices), so a case refused here fails everywhere.
MAX_GPU_BYTES = 288 * 10**9
BF16, INT32, FP32 = 2, 4, 4


def case_bytes(v: dict[str, Any]) -> dict[str, int]:
    """The least bytes a case's tensors take, by part: q, cache, out, indices (and logits)."""
    queries = v["tokens"] if v["tokens"] else v["batch_size"] * v["s_q"]
    if v["op"] == "topk":  # the indexer's logits in, the picks out (no cache)
        keys = v["context_len"] // (v["compress_ratio"] or 1)
        return {"logits": queries * keys * FP32, "indices": queries * v["topk"] * INT32}
    requests = 1 if v["tokens"] else v["batch_size"]
    token = LAYOUT_TABLE[v["layout"]].bytes_per_token(v["d_qk"])
    parts = {"cache": requests * v["context_len"] * token}
    if v["op"] in ("decode", "prefill"):
        parts["q"] = queries * v["num_heads"] * v["d_qk"] * BF16
        parts["out"] = queries * v["num_heads"] * v["d_v"] * BF16
        parts["indices"] = queries * (v["topk"] + v["extra_topk"]) * INT32
    elif v["op"] in ("dequant", "page_split"):
        parts["out"] = parts["cache"]
    elif v["op"] == "cache_write":  # the cache's pages for every request, and its copy
        parts["cache"] = v["batch_size"] * v["context_len"] * token
        parts["out"] = parts["cache"]
    elif v["op"] == "remap":
        parts["indices"] = 2 * queries * (v["topk"] + v["extra_topk"]) * INT32
    elif v["op"] == "indexer":
        parts["logits"] = queries * v["context_len"] * FP32
    return parts


def size_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Candidates blaming the fields that size the largest part, when the case cannot fit."""
    parts = case_bytes(v)
    if sum(parts.values()) <= MAX_GPU_BYTES:
        return None
    why = f"this case {_needs(parts)}, more than any GPU holds ({gib(MAX_GPU_BYTES)})"
    largest = max(parts, key=parts.get)
    if largest == "cache":
        blamed = ("context_len", "batch_size")
    elif largest == "logits":
        blamed = ("context_len", "tokens", "batch_size")
    else:
        blamed = ("num_heads", "tokens", "batch_size", "s_q", "topk", "context_len")
    return [(name, why) for name in blamed]


def machine_problem(v: dict[str, Any], budget: int, what: str) -> str | None:
    """Why a case cannot run within `budget` bytes (`what`: whose memory), or None."""
    parts = case_bytes(v)
    if sum(parts.values()) <= budget:
        return None
    return f"{_needs(parts)}, more than {what} ({gib(budget)})"


def _needs(parts: dict[str, int]) -> str:
    """ "needs 12.0 GiB (cache 11.5 GiB, ...)": the total and its parts of a GiB or more."""
    big = sorted((kv for kv in parts.items() if kv[1] >= 2**30), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} {gib(n)}" for k, n in big)
    return f"needs {gib(sum(parts.values()))} ({shown})"


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
