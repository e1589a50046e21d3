"""How an engine release calls FlashMLA's Hopper sparse prefill at few heads per rank.

vLLM 0.34.0 (vllm/v1/attention/backends/mla/flashmla_sparse.py,
FlashMLASparseImpl._should_use_bf16_small_head_kernel and _bf16_flash_mla_kernel): on the
sm90 family, at 8, 16 or 32 query heads, the call runs unpadded (FlashMLA's small-head kernels,
`launch_small_heads<512|576, ..., 16|32>`, in the same binary as 0.33.0's) when the call's tokens
exceed the SM count times 1 (times 2 at 32 heads) - "performance heuristics, not correctness
requirements" -, else it pads q to 64 heads (`prefill_padding = 64`) as 0.33.0 does always."""

from __future__ import annotations

VLLM_034 = "vllm-0.34.0"
POLICIES = ("", VLLM_034)  # "": pad as the engine presets always did
SMALL_HEADS = (8, 16, 32)


def tokens_per_sm(num_heads: int) -> int:
    return 2 if num_heads == 32 else 1


def unpadded(policy: str, arch: str, num_heads: int, tokens: int, sm_count: int | None) -> bool:
    """Whether `policy` runs this prefill call at its own head count (no padding)."""
    if policy != VLLM_034 or arch != "sm90" or num_heads not in SMALL_HEADS or not sm_count:
        return False
    return tokens > sm_count * tokens_per_sm(num_heads)


def rule_text(num_heads: int, tokens: int, sm_count: int, padded_to: int) -> str:
    """What the policy did with one call, for the row's info."""
    limit = sm_count * tokens_per_sm(num_heads)
    if tokens > limit:
        return f"{num_heads} heads unpadded: {tokens} tokens > {limit} (SMs x {limit // sm_count})"
    return f"padded to {padded_to}: {tokens} tokens <= {limit} (SMs x {limit // sm_count})"
