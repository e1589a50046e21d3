"""The project's Triton top-k for the `topk` op (reference/topk.py has the definitions): the
indexer's selection as a kernel of its own, the three forms fused into its last pass.

One program per row (kernels/topk.py): a radix select finds the k-th largest logit of the
row's window in four passes of 8 bits (a 256-bin histogram of the logits whose higher bits
match the digits found so far, on the uint32 key whose order is the float order), then one
pass writes every logit above it and as many equal to it as k still needs, in window order
(unsorted, as FlashInfer's default), as column, slot or ragged-buffer index; -1 after.
-inf (and NaN) logits are never picked. Five reads of the window per row: one program per row
leaves most SMs idle at batch 1 (a split of each row over programs is the next step).

Runs compiled on a GPU and through Triton's interpreter on a CPU (tests, tiny shapes).
"""

from __future__ import annotations

from dsv4bench.backends.triton import jit

FORMS = ("plain", "page_table", "ragged")  # the kernel's FORM constant is the position
BLOCK = 2048  # logits a program reads at a time
WARPS = 8
POISON = -3  # neither -1 nor an index: an output the kernel never wrote shows


def launcher(
    logits,
    lengths,
    k: int,
    form: str = "plain",
    *,
    row_starts=None,
    block_table=None,
    row_to_batch=None,
    offsets=None,
    page_size: int = 1,
    block: int = BLOCK,
):
    """(launch, out): launch() writes the (rows, k) int32 picks of `form` into out."""
    import torch

    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError("logits must be a (rows, width) float32 tensor with unit column stride")
    rows = logits.shape[0]
    device = logits.device
    i32 = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
    lens = i32(lengths)
    starts = i32(row_starts) if row_starts is not None else torch.zeros_like(lens)
    dummy = torch.zeros(1, dtype=torch.int32, device=device)
    table = i32(block_table) if form == "page_table" else dummy.view(1, 1)
    batch = i32(row_to_batch) if form == "page_table" else dummy
    offs = i32(offsets) if form == "ragged" else dummy
    out = torch.empty(rows, k, dtype=torch.int32, device=device)
    kernel = jit.kernel("topk", "topk", device)
    interpret = device.type == "cpu"
    opts = {} if interpret else {"num_warps": WARPS}
    meta = dict(FORM=FORMS.index(form), PAGE=page_size, BLOCK=block)
    args = (logits, logits.stride(0), lens, starts, out, table, table.stride(0), batch, offs, k)

    def launch():
        if rows:
            with jit.interpreting(interpret):
                kernel[(rows,)](*args, **meta, **opts)
        return out

    return launch, out


def prepare(case, inputs: dict, device: str):
    """The suite's Prepared for a topk case: run() launches the kernel."""
    from dsv4bench.backends.base import Prepared
    from dsv4bench.cases.output import Output

    x = inputs
    launch, out = launcher(
        x["logits"],
        x["lengths"],
        case.topk,
        case.form,
        row_starts=x.get("row_starts"),
        block_table=x.get("block_table"),
        row_to_batch=x.get("row_to_batch"),
        offsets=x.get("offsets"),
        page_size=case.page_size,
    )
    info = {"kernel": "topk_radix", "block": BLOCK, "num_warps": WARPS, "form": case.form}
    return Prepared(
        run=launch,
        finish=lambda raw: Output(raw),
        poison=lambda: out.fill_(POISON),
        info=info,
    )
