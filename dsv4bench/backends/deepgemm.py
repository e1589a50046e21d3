"""DeepGEMM's lightning-indexer kernels, through its documented Python API (README, and
tests/test_attention.py `test_paged_mqa_logits` / `test_mqa_logits`):

  schedule = deep_gemm.get_paged_mqa_logits_metadata(context_lens, deep_gemm.get_num_sms())
  logits = deep_gemm.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
                                          schedule, max_model_len, clean_logits=True)
  logits = deep_gemm.fp8_mqa_logits(q, (kv, kv_scales), weights, ks, ke)

q, kv e4m3; kv_cache the (blocks, block_size, 1, D + 4) uint8 cache viewed as DeepGEMM wants
it; weights fp32. The schedule is computed in prepare() (not timed), as engines compute it once
per batch. Top-k is torch.topk, as for the Triton backend. DeepGEMM is found as the `deep_gemm`
module (DeepGEMM itself or the sgl-deep-gemm wheel); sgl-deep-gemm 0.2.5 does not load on torch
2.11 (KERNEL_FACTS §8), so on the lent GPUs this backend reports itself unsupported.
"""

from __future__ import annotations

import importlib

from dsv4bench.backends.base import Backend, LazyOps, Output, Prepared, Provider, Unsupported
from dsv4bench.cases.case import Case

NOT_FOUND = "DeepGEMM not importable (deep_gemm)"


def discover():
    try:
        return importlib.import_module("deep_gemm")
    except Exception as e:  # an ABI mismatch raises ImportError or OSError: the reason matters
        raise Unsupported(f"{NOT_FOUND}: {type(e).__name__}: {e}"[:300]) from e


class DeepGEMM(Backend):
    name = "deepgemm"
    description = "DeepGEMM fp8_paged_mqa_logits / fp8_mqa_logits (the indexer), top-k by torch"
    archs = ("sm90", "sm100")
    ops = ("indexer",)
    layouts = ()  # the indexer's own key cache, no attention cache

    def __init__(self, module=None):
        self._found = LazyOps(module, discover)

    def provider(self) -> Provider:
        dg = self._found.get()
        return Provider("deep_gemm", getattr(dg, "__version__", ""), getattr(dg, "__file__", ""))

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        from dsv4bench.cases import indexer_case
        from reference.indexer import topk_indices

        dg = self._found.get()
        x = inputs
        if "kv" in x:

            def logits():
                kv = (x["kv"], x["kv_scales"])
                return dg.fp8_mqa_logits(x["q"], kv, x["weights"], x["ks"], x["ke"])

            kernel = "fp8_mqa_logits"
        else:
            lens = x["context_lens"]
            sched = dg.get_paged_mqa_logits_metadata(lens, dg.get_num_sms())
            cache = x["kv_cache"]  # uint8 (blocks, block_size, 1, D + 4), as DeepGEMM's tests

            def logits():
                return dg.fp8_paged_mqa_logits(
                    x["q"],
                    cache,
                    x["weights"],
                    lens,
                    x["block_table"],
                    sched,
                    indexer_case.keys(case),
                    clean_logits=True,
                )

            kernel = "fp8_paged_mqa_logits"

        def run():
            out = logits()
            return out, topk_indices(out, case.topk)

        info = {"kernel": kernel, "topk": "torch.topk"}
        return Prepared(run=run, finish=lambda raw: Output(raw[0], None, raw[1]), info=info)
