"""How an attention case's values are drawn (Case.values): its q and the latent rows its cache
writer quantizes (cases/tensors.cache), so an FP8 kernel's error shows on data shaped like real
activations, not only on random normal values.

  normal    every channel N(0, 1): what the suite always drew.
  outliers  what LLM queries and KV latents look like: a few channels far larger than the
            rest, heavy-tailed, and a RoPE part larger than the NoPE part.
            - q and kv each have OUTLIER_CHANNELS NoPE channels of their own (two disjoint
              sets, fixed by the case's seed, the same in every token and head) drawn as
              OUTLIER_SCALE * t(OUTLIER_DF), Student's t with 4 degrees of freedom: P(|x| > 448)
              = P(|t| > 7) = 0.22 % of those values pass e4m3's largest value (448), where a
              cast at scale 1 (sglang's identity q and kv scales for its FP8 prefill) saturates
              (a few hundred values of a 256-token chunk's q at 64 heads);
            - each tensor's channels at the other's outlier channels are N(0, 1) / OUTLIER_SCALE
              (a model keeps q . k of a massive channel in range: there the products, and so the
              logits, stay the size the normal case has; e4m3 reads those small values coarsely);
            - the RoPE part (the last ROPE_DIM channels) N(0, ROPE_SCALE^2);
            - every other channel N(0, 1).
            Logits: about 1.5x the normal case's standard deviation (the RoPE part's), with
            heavy tails from the outlier channels.

Deterministic: the channels come from the case's seed, the values from its generator
(cases/inputs.seed_of).
"""

from __future__ import annotations

import torch

ROPE_DIM = 64  # DeepSeek's qk_rope_head_dim: the last channels of q and of a cache row
OUTLIER_CHANNELS = 8
OUTLIER_SCALE = 64.0
OUTLIER_DF = 4
ROPE_SCALE = 2.0
ROLES = ("q", "kv")


def draw(
    values: str, shape: tuple[int, ...], g: torch.Generator, device, role: str, seed: int = 0
) -> torch.Tensor:
    """fp32 values of `shape` (channels last) for `role` (q or kv), as `values` says."""
    if values == "normal":
        return torch.randn(*shape, generator=g, device=device)
    if values != "outliers":
        raise ValueError(f"values: expected one of normal, outliers, got {values!r}")
    d = shape[-1]
    own, other = outlier_channels(d, seed)[:: 1 if role == "q" else -1]
    x = torch.randn(*shape, generator=g, device=device)
    x[..., d - ROPE_DIM :] *= ROPE_SCALE
    x[..., other.to(device)] /= OUTLIER_SCALE
    tails = student_t(OUTLIER_DF, (*shape[:-1], len(own)), g, device)
    x[..., own.to(device)] = OUTLIER_SCALE * tails
    return x


def outlier_channels(d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q's, kv's) outlier channels: two disjoint sorted sets of OUTLIER_CHANNELS NoPE channels
    of a d-channel row, fixed by `seed`."""
    nope = d - ROPE_DIM
    if nope < 2 * OUTLIER_CHANNELS:
        raise ValueError(f"values outliers needs more than {ROPE_DIM} channels, got {d}")
    perm = torch.randperm(nope, generator=torch.Generator().manual_seed(seed))
    n = OUTLIER_CHANNELS
    return perm[:n].sort().values, perm[n : 2 * n].sort().values


def student_t(df: int, shape: tuple[int, ...], g: torch.Generator, device) -> torch.Tensor:
    """Student's t with `df` degrees of freedom: N(0, 1) / sqrt(chi2(df) / df), chi2 a sum of
    df squared normals (drawn from g, so the case's seed fixes them)."""
    z = torch.randn(*shape, generator=g, device=device)
    chi2 = torch.randn(df, *shape, generator=g, device=device).square().sum(0)
    return z / (chi2 / df).sqrt()
