"""What a `topk` Case means (reference/topk.py has the selection): the lightning indexer's top-k
alone, over the fp32 logits an `indexer` case of the same sizes leaves (cases/indexer_case.py).

Rows: tokens == 0: batch_size requests of s_q decode rows (the paged form, logits width
max_model_len = keys(case)); tokens > 0: one prefill chunk of `tokens` rows (the ragged form,
ks = 0). Row i sees the keys of its position: (pos + 1) // compress_ratio.

The logits (a documented distribution, made by the oracle indexer itself): reference/indexer.py's
mqa_logits over one random key sequence of keys(case) entries shared by every request, with
LOGIT_HEADS heads of LOGIT_DIM, e4m3 q and keys (per-key fp32 scale), fp32 weights of both
signs, -inf outside each row's window. With few heads a key's relu terms are all zero with
probability about 2**-LOGIT_HEADS, so about 6% of the logits are exactly 0: ties at the k-th
place are common where k is near half the window (short contexts), as with real logits that the
fp8 rounding collapses. The real indexer's 64 x 128 heads would cost 64x the work to make the
same kind of input; what top-k reads (a row of fp32 values, -inf padded) is the same.

Inputs (every index tensor int32): logits (rows, width) fp32, lengths (rows,), row_starts (rows,)
zeros; page_table: block_table (b, pages) (pages of page_size keys handed out in a random order),
row_to_batch (rows,); ragged: offsets (rows,) = where the row's request starts in a ragged buffer
of every request's keys (cumulative key counts).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dsv4bench.cases import indexer_case
from dsv4bench.cases.case import Case

LOGIT_HEADS, LOGIT_DIM = 4, 32
INT32 = 4
INVALID_POISON = -3  # neither -1 nor an index: an output a kernel never wrote shows


def rows(case: Case) -> int:
    return indexer_case.rows(case)


def width(case: Case) -> int:
    return indexer_case.keys(case)


def positions(case: Case, device) -> torch.Tensor:
    """(rows,) each row's token position: the last s_q of each request, or the chunk's."""
    n = case.tokens or case.s_q
    pos = case.context_len - n + torch.arange(n, device=device)
    return pos if case.tokens else pos.repeat(case.batch_size)


def requests(case: Case) -> int:
    return 1 if case.tokens else case.batch_size


def logits_bytes(case: Case) -> int:
    return indexer_case.logits_bytes(case)


def bytes_moved(case: Case) -> int:
    """At least: every row's window of fp32 logits read once, the (rows, topk) picks written."""
    return indexer_case.visible_total(case) * 4 + rows(case) * case.topk * INT32


def of_indexer(case: Case, form: str = "plain") -> Case:
    """The topk case of an indexer case's own selection: the same sizes (so the same case id as
    a topk scenario's point of that shape), the picks in `form`."""
    return replace(case, op="topk", form=form)


def make_inputs(case: Case, device, g: torch.Generator) -> dict:
    """The tensors of one topk case (module docstring), drawn from `g` (cases/inputs.py seeds
    it without the form: every form of a case reads the same logits)."""
    from dsv4bench.cases.tensors import block_table
    from reference import indexer

    n, m = width(case), rows(case)
    lengths = ((positions(case, device) + 1) // indexer_case.ratio(case)).to(torch.int32)
    starts = torch.zeros_like(lengths)
    keys = torch.randn(n, LOGIT_DIM, generator=g, device=device)
    kv = indexer.split_key_cache(indexer.quantize_key_cache(keys, case.page_size), n)
    q = torch.randn(m, LOGIT_HEADS, LOGIT_DIM, generator=g, device=device)
    w = torch.randn(m, LOGIT_HEADS, generator=g, device=device)
    logits = indexer.mqa_logits(q.to(torch.float8_e4m3fn), kv, w, starts, starts + lengths)
    x = {"logits": logits, "lengths": lengths, "row_starts": starts}
    req = torch.arange(m, device=device) // (case.tokens or case.s_q)
    if case.form == "page_table":
        pages = max(1, -(-n // case.page_size))
        x["block_table"] = block_table(requests(case), pages, device, g).to(torch.int32)
        x["row_to_batch"] = req.to(torch.int32)
    elif case.form == "ragged":
        per_request = lengths.view(requests(case), -1)[:, -1].long()  # the request's keys
        start = torch.cumsum(per_request, 0) - per_request
        x["offsets"] = start[req].to(torch.int32)
    return x


def columns(case: Case, x: dict, picks: torch.Tensor) -> torch.Tensor:
    """A form's picks as column indices of the logits rows (the judge compares those); a pick
    that names no key of the row's own window becomes `width` (out of range: invalid), -1
    stays -1."""
    picks = picks.long()
    n = x["logits"].shape[1]
    starts = x["row_starts"].long()[:, None]
    listed = picks >= 0
    if case.form == "ragged":
        local = picks - x["offsets"].long()[:, None]
    elif case.form == "page_table":
        local = _slot_positions(picks, x["block_table"], x["row_to_batch"], case.page_size)
    else:
        local = picks - starts
    inside = (local >= 0) & (local < x["lengths"].long()[:, None])
    cols = torch.where(inside, local + starts, n)
    return torch.where(listed, cols, -1)


def _slot_positions(slots, table, row_to_batch, page_size: int) -> torch.Tensor:
    """Request-local positions of global slots through the inverse of the block table (-1
    where a slot's page is not one of the row's request's pages)."""
    table = table.long()
    b, per = table.shape
    top = int(table.max()) + 1 if table.numel() else 1
    block_of = torch.full((top + 1,), -1, dtype=torch.long, device=slots.device)
    owner = torch.full((top + 1,), -1, dtype=torch.long, device=slots.device)
    valid = table >= 0
    flat = table[valid]
    block_of[flat] = torch.arange(per, device=slots.device).expand(b, per)[valid]
    owner[flat] = torch.arange(b, device=slots.device)[:, None].expand(b, per)[valid]
    page = (slots.clamp(min=0) // page_size).clamp(max=top)
    ok = (slots >= 0) & (owner[page] == row_to_batch.long()[:, None])
    return torch.where(ok, block_of[page] * page_size + slots % page_size, -1)
