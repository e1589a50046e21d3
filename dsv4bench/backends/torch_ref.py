"""The oracle run as a kernel: the timing baseline and the CPU default (dsv4bench.cases.oracle)."""

from __future__ import annotations

from dsv4bench.backends.base import Backend, Prepared, Provider
from dsv4bench.cases.case import ARCHS, Case
from dsv4bench.cases.oracle import indexer_logits, oracle_call


class TorchReference(Backend):
    name = "torch"
    description = "the PyTorch oracle (reference/), fp32, memory-bounded; CPU and CUDA"
    archs = ARCHS
    ops = ("decode", "prefill", "dequant", "remap", "indexer", "page_split", "topk", "cache_write")
    layouts = None  # any layout with a writer and reader in reference/layout_table.py
    chunked_gather = True
    is_oracle = True
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "yes: the oracle's",
        "CUDA graphs": "no: its gathers sync with the host (nonzero, reference/attention.py)",
        "batch invariance": "not promised: rows are attended in blocks (reference/attention.py)",
    }

    def provider(self) -> Provider:
        import torch

        return Provider("reference", f"torch {torch.__version__}", "reference/")

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        info = {}
        if case.op in ("indexer", "topk"):  # the size of the matrix engines must hold
            from dsv4bench.cases import indexer_case

            info["logits_bytes"] = indexer_case.logits_bytes(case)
        if case.op == "topk":
            info["kernel"] = "torch.topk"
        logits = None
        if case.op == "indexer":
            info["topk"] = "torch.topk"
            logits = lambda: indexer_logits(case, inputs)  # noqa: E731
        # the oracle reads the inputs as they are: they are the buffers a refill fills
        buffers = tuple(inputs[k] for k in sorted(inputs) if hasattr(inputs[k], "data_ptr"))
        return Prepared(run=oracle_call(case, inputs), info=info, logits=logits, buffers=buffers)
