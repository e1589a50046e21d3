"""vLLM's batch-spec grammar (benchmarks/attention_benchmarks/batch_spec.py in vLLM): a mixed
batch in one string, such as `2q2k_32q1s1k` (2 prompts of 2048 tokens and 32 decodes at 1K).

    spec     := segment ("_" segment)*
    segment  := [COUNT] "q" SIZE ["s" SIZE]
    SIZE     := DIGITS ["k"]          ("k": times 1024)

A segment is COUNT identical requests (default 1) of q_len new query tokens over a sequence
of s tokens in all (the KV length, the query tokens included; default q_len: a fresh prompt).
vLLM's own parser takes what its regex matches; this one is stricter and says why it refuses:
ASCII digits only, COUNT, q_len and s at least 1, s at least q_len (vLLM's manual batches
refuse kv < q too), no empty segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GRAMMAR = "[COUNT]q<Q>[k][s<S>[k]] segments joined by _ (e.g. 2q2k_32q1s1k)"
_SEGMENT = re.compile(r"(?:([0-9]+))?q([0-9]+)(k?)(?:s([0-9]+)(k?))?")


class BatchSpecError(ValueError):
    """A spec the grammar refuses; the message is one line naming the bad token."""


@dataclass(frozen=True)
class Request:
    q_len: int  # new query tokens
    kv_len: int  # the whole sequence, the query tokens included

    @property
    def context_len(self) -> int:
        """Tokens already in the cache before this step."""
        return self.kv_len - self.q_len


@dataclass(frozen=True)
class Segment:
    """`count` identical requests: one `_`-separated token of a spec."""

    count: int
    request: Request


def parse_segments(spec: str) -> tuple[Segment, ...]:
    if not isinstance(spec, str) or not spec:
        raise BatchSpecError(f"empty batch_spec: expected {GRAMMAR}")
    out = []
    for token in spec.split("_"):
        m = _SEGMENT.fullmatch(token)
        if m is None:
            raise BatchSpecError(f"bad batch_spec token {token!r} in {spec!r}: expected {GRAMMAR}")
        count = int(m[1]) if m[1] else 1
        q_len = _size(m[2], m[3])
        kv_len = _size(m[4], m[5]) if m[4] else q_len
        if count < 1 or q_len < 1 or kv_len < 1:
            why = "a count, q and s of at least 1"
            raise BatchSpecError(f"bad batch_spec token {token!r} in {spec!r}: expected {why}")
        if kv_len < q_len:
            why = f"s >= q (the sequence holds the query), got q {q_len} > s {kv_len}"
            raise BatchSpecError(f"bad batch_spec token {token!r} in {spec!r}: expected {why}")
        out.append(Segment(count, Request(q_len, kv_len)))
    return tuple(out)


def parse(spec: str) -> tuple[Request, ...]:
    """Every request of the batch, in spec order."""
    return tuple(s.request for s in parse_segments(spec) for _ in range(s.count))


def format_spec(segments: tuple[Segment, ...] | list[Segment]) -> str:
    """The canonical spelling: no count of 1, `Nk` for multiples of 1024, no `s` for a fresh
    prompt (s == q). parse_segments(format_spec(x)) == x."""
    parts = []
    for seg in segments:
        r = seg.request
        count = str(seg.count) if seg.count != 1 else ""
        tail = "" if r.kv_len == r.q_len else f"s{_show(r.kv_len)}"
        parts.append(f"{count}q{_show(r.q_len)}{tail}")
    return "_".join(parts)


def _size(digits: str, k: str) -> int:
    return int(digits) * (1024 if k else 1)


def _show(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)
