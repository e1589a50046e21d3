"""The project's Triton kernels as one backend (`triton`): sparse MLA decode and prefill
(attention.py), the lightning indexer's FP8 logits (indexer.py) and its top-k (topk.py), and
the sparse-prefill route's helper ops, FP8 -> bf16 dequantization, index remap and the V4 page
split (cache_ops.py). Checks and allocations happen in prepare(); run() only launches. Triton is
imported when first needed (jit.py): this module imports without it.
"""

from __future__ import annotations

from dsv4bench.backends.base import (
    Backend,
    Prepared,
    Provider,
    Unsupported,
    check_cache_width,
    fp8_cache_reason,
)
from dsv4bench.backends.triton import attention, cache_ops, indexer, jit, topk
from dsv4bench.backends.triton.cache_ops import (
    DEQUANT_BLOCK_T,
    DEQUANT_WARPS,
    REMAP_BLOCK,
    REMAP_WARPS,
    SPLIT_BLOCK,
    SPLIT_WARPS,
)
from dsv4bench.cases.case import SPLIT_PAGE, Case
from dsv4bench.cases.output import Output

NOT_FOUND = jit.NOT_FOUND
REMAP_POISON = -2  # neither -1 nor a slot: a remap that writes nothing is caught
# the provider's location, as rows have recorded it since the backend's first row
LOCATION = "dsv4bench.backends.triton_kernels"


# ---- the backend ------------------------------------------------------------------------


def _case_reason(case: Case) -> str | None:
    """Why the kernels cannot take this case, whatever the arch; None if they can."""
    if case.op == "dequant":
        reason = fp8_cache_reason(case, "triton dequant kernels")
        if reason:
            return reason
    if case.op == "page_split" and case.layout != "v4":
        return f"the triton page split re-pages v4 caches, not {case.layout}"
    if case.page_size < 1:
        return f"page_size must be >= 1, got {case.page_size}"
    if case.op == "remap" and case.tokens:
        return "the triton remap maps top-k to global slots, not vLLM's prefill workspace rows"
    if case.op == "remap" and case.form:
        return f"the triton remap maps top-k to global slots, not one DCP rank's (form {case.form})"
    return None


class TritonKernels(Backend):
    name = "triton"
    description = (
        "the project's Triton kernels: sparse MLA decode from the FP8 caches and sparse prefill "
        "(attention.py), FP8 cache -> bf16 dequant (V4, V3.2), index remap, "
        "the lightning indexer's FP8 logits, its top-k (radix select, three forms)"
    )
    archs = ("sm90", "sm100", "sm120")
    ops = ("dequant", "remap", "indexer", "decode", "prefill", "page_split", "topk")
    layouts = ("v32", "v4")
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "yes: decode and prefill return lse beside out (attention.py prepare), "
        "prefill max_logits too",
        "CUDA graphs": "yes: compiled and planned in prepare() (warm_up), the call launches",
        "batch invariance": "not promised: the tuning rules (triton/tuning.py) pick splits "
        "by the case's sizes",
    }

    def provider(self) -> Provider:
        t = jit.load()
        return Provider("triton", t.__version__, LOCATION)

    def supports(self, case: Case, arch: str) -> str | None:
        reason = super().supports(case, arch) or _case_reason(case)
        if reason or case.op not in ("decode", "prefill"):
            return reason
        return attention.case_reason(case)

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        """Checks and allocates here; run() only launches. poison() returns what it filled."""
        self.provider()  # Unsupported without Triton
        if case.op == "indexer":
            return indexer.prepare(case, inputs, device)
        if case.op == "topk":
            return topk.prepare(case, inputs, device)
        if case.op in ("decode", "prefill"):
            return attention.prepare(case, inputs, device)
        reason = _case_reason(case) if case.op in self.ops else f"no {case.op} kernel"
        if reason:
            raise Unsupported(reason)
        if case.op == "dequant":
            cache = inputs["k_cache"]
            check_cache_width(case, "k_cache", cache)
            launch, out = cache_ops.dequant_launcher(cache, case.layout)
            poison = lambda: out.fill_(float("nan"))
            kernel = f"dequant_{case.layout}"
            info = {"kernel": kernel, "block_tokens": DEQUANT_BLOCK_T, "num_warps": DEQUANT_WARPS}
        elif case.op == "page_split":
            cache = inputs["k_cache"]
            check_cache_width(case, "k_cache", cache)
            launch, out = cache_ops.page_split_launcher(cache, SPLIT_PAGE)
            poison = lambda: out.fill_(0xA5)  # not a byte a correct split leaves everywhere
            info = {"kernel": "page_split_v4", "block_words": SPLIT_BLOCK, "num_warps": SPLIT_WARPS}
        else:
            launch, out = cache_ops.remap_launcher(
                inputs["local_indices"], inputs["block_table"], case.page_size
            )
            poison = lambda: out.fill_(REMAP_POISON)
            info = {"kernel": "remap", "block": REMAP_BLOCK, "num_warps": REMAP_WARPS}
        return Prepared(run=launch, finish=lambda raw: Output(raw), poison=poison, info=info)
