"""`torch-topk`: the top-k engines call, `torch.topk` itself, as a `topk` backend beside the
oracle's masked selection (`torch`, reference/topk.py: a block-wise mask of each row's window,
then torch.topk, then -1 padding: more work than an engine's call, so a ratio against the
`torch` rows does not divide by torch.topk).

The call is the one vLLM's sparse indexer makes on the logits it leaves (-inf outside each
row's window: cases/topk_case.py): `logits.topk(min(topk, width), dim=-1)`, indices to int32,
then every pick outside the row's window (before its start, at or past start + length) set to
-1, as vLLM's mask_lo / mask_hi do. Timed: that call and
its mask, on the logits as they are. Plain form only: the page-table and ragged forms are an
engine's own transform kernels (FlashInfer's, sglang's), not a torch.topk call.
"""

from __future__ import annotations

from dsv4bench.backends.base import Backend, Prepared, Provider
from dsv4bench.cases.case import ARCHS, Case


class TorchTopK(Backend):
    name = "torch-topk"
    description = "torch.topk as engines call it on the indexer's logits (plain form)"
    archs = ARCHS
    ops = ("topk",)
    layouts = None
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "no: a top-k selection has no softmax",
        "CUDA graphs": "yes: window ends made in prepare(); topk and masked_fill sync none",
        "batch invariance": "not promised: torch.topk breaks ties as its kernel does",
    }

    def provider(self) -> Provider:
        import torch

        return Provider("torch.topk", f"torch {torch.__version__}", "torch")

    def supports(self, case: Case, arch: str) -> str | None:
        reason = super().supports(case, arch)
        if reason:
            return reason
        if case.form != "plain":
            return (
                f"torch.topk returns column indices (form plain): the {case.form} form is an "
                "engine's own transform kernel, not a torch.topk call"
            )
        return None

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        import torch

        from dsv4bench.cases.output import Output

        logits = inputs["logits"]
        rows, width = logits.shape
        k, kk = case.topk, min(case.topk, width)
        starts = inputs["row_starts"].long()[:, None]
        ends = starts + inputs["lengths"].long()[:, None]
        pad = torch.full((rows, k - kk), -1, dtype=torch.int32, device=logits.device)

        def run():
            picks = logits.topk(kk, dim=-1)[1]
            picks = picks.masked_fill((picks < starts) | (picks >= ends), -1).to(torch.int32)
            return torch.cat([picks, pad], 1) if k > kk else picks

        info = {"kernel": "torch.topk", "call": "logits.topk(min(topk, width), dim=-1)"}
        return Prepared(run=run, finish=lambda raw: Output(raw), info=info)
