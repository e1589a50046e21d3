"""A mixed batch (cases/batch_spec.py) as the calls vLLM's sparse MLA backends make of it on
Hopper: the decode part and the prefill part(s), each one suite case.

How vLLM splits a batch (vllm 0.33.0; docs/scenarios.md, "vLLM batch specs"):
- the scheduler puts requests of at most `reorder_batch_threshold` query tokens first
  (reorder_batch_to_split_decodes_and_prefills), and the metadata builder cuts the batch
  where they end (split_decodes_and_prefills, called by SparseMLACommonMetadataBuilder with
  that threshold);
- FlashMLA's sparse builder sets the threshold from the heads per rank (sm90: 16 and 32
  heads 128, 64 and 128 heads 256, others 256; FLASH_ATTN_MLA_SPARSE uses the same table)
  and requires uniform decodes: a short request whose query length differs from the first
  short request's is a prefill;
- decodes go to the FP8 decode kernel as (requests, q_len); prefills to the sparse prefill
  kernel over a bf16 workspace, one chunk per request. Below 32 heads per rank vLLM instead
  runs every token through the decode kernel in one call (fp8_use_mixed_batch): the suite's
  nearest kind is a prefill on route decode-mixed, one case per distinct request.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bench.cases.batch_spec import Request

# FlashMLASparseMetadataBuilder, non-sm100: heads per rank -> reorder_batch_threshold.
SM90_DECODE_THRESHOLD = {16: 128, 32: 128, 64: 256, 128: 256}
SM90_DEFAULT_THRESHOLD = 256
MIN_HEADS_FOR_BF16_PREFILL = 32  # below it, vLLM's FlashMLA runs prefills on the decode kernel


def decode_threshold(num_heads: int) -> int:
    """The longest query a request may have and still be a decode (vLLM's sm90 table)."""
    return SM90_DECODE_THRESHOLD.get(num_heads, SM90_DEFAULT_THRESHOLD)


def prefill_route(num_heads: int) -> str:
    """The suite's route for vLLM's prefill path at this many heads per rank."""
    return "decode-mixed" if num_heads < MIN_HEADS_FOR_BF16_PREFILL else "sparse-prefill"


@dataclass(frozen=True)
class Part:
    """One kernel call of a split batch, as suite case fields."""

    role: str  # decode | prefill
    requests: tuple[Request, ...]
    route: str = ""  # a prefill's route (Case.route)

    @property
    def uniform(self) -> bool:
        return len({r.kv_len for r in self.requests}) == 1

    def fields(self) -> dict:
        """Case axis values: decode (batch_size, s_q, context_len or context_lens) or prefill
        (tokens, context_len or context_lens: one chunk per request)."""
        kv = [r.kv_len for r in self.requests]
        if self.role == "decode":
            out = {"op": "decode", "batch_size": len(kv), "s_q": self.requests[0].q_len}
        else:
            out = {"op": "prefill", "tokens": self.requests[0].q_len, "route": self.route}
        if len(kv) == 1 or (self.role == "decode" and self.uniform):
            out["context_len"] = kv[0]
        else:  # a ragged batch (Case.context_lens): batch_size and context_len follow
            out["context_lens"] = tuple(kv)
        return out


def split(requests: tuple[Request, ...], num_heads: int, route: str | None = None) -> list[Part]:
    """The decode part (if any) then the prefill parts: prefills grouped by query length in
    first-seen order (a ragged sparse-prefill case each); on a route other than
    sparse-prefill (one request per case), one part per distinct request."""
    limit = decode_threshold(num_heads)
    first = next((r.q_len for r in requests if r.q_len <= limit), None)
    decodes = [r for r in requests if r.q_len == first]
    rest = [r for r in requests if r.q_len != first]
    parts = [Part("decode", tuple(decodes))] if decodes else []
    route = route or prefill_route(num_heads)
    if route == "sparse-prefill":
        keys = dict.fromkeys(r.q_len for r in rest)
        groups = [tuple(r for r in rest if r.q_len == q) for q in keys]
    else:
        groups = [(r,) for r in dict.fromkeys(rest)]
    return parts + [Part("prefill", g, route) for g in groups]
