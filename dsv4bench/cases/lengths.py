"""Per-request context lengths of a ragged batch (the `context_lens` axis; docs/scenarios.md).

A value is an explicit list or a named distribution, drawn with Python's own generator
(`random.Random(seed)`: the same lengths on every machine and torch version):
  lognormal  `batch` lengths around `mean`: mean * exp(sigma * z - sigma^2 / 2), rescaled so
             that they sum to exactly mean * batch (a uniform batch of context `mean` holds the
             same tokens), each a multiple of `multiple` and at least `multiple`
  one-long   one request of `long` tokens and batch - 1 of `short` (a long prompt decoding
             beside chat turns)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

DISTRIBUTIONS = ("lognormal", "one-long")


@dataclass(frozen=True)
class Lengths:
    lengths: tuple[int, ...]
    label: str  # "list", or the distribution and its parameters


def explicit(lengths: list[int]) -> Lengths:
    return Lengths(tuple(lengths), "list")


def lognormal(mean: int, sigma: float, batch: int, seed: int = 0, multiple: int = 1) -> Lengths:
    """Lengths summing to mean * batch (mean must be a multiple of `multiple`)."""
    if mean % multiple:
        raise ValueError(f"mean {mean} is not a multiple of {multiple}")
    rng = random.Random(seed)
    raw = [math.exp(sigma * rng.gauss(0.0, 1.0) - sigma * sigma / 2) for _ in range(batch)]
    total = mean // multiple * batch  # in multiples
    scale = total / sum(raw)
    lens = [max(1, round(r * scale)) for r in raw]
    longest = max(range(batch), key=lambda i: lens[i])
    lens[longest] += total - sum(lens)  # the rounding remainder goes to the longest
    if lens[longest] < 1:  # only when nearly every request sits at the floor
        raise ValueError(f"{batch} requests of at least {multiple} exceed mean {mean} each")
    label = f"lognormal(mean={mean},sigma={sigma:g},seed={seed})"
    return Lengths(tuple(n * multiple for n in lens), label)


def one_long(long: int, short: int, batch: int) -> Lengths:
    return Lengths((long,) + (short,) * (batch - 1), f"one-long(long={long},short={short})")
