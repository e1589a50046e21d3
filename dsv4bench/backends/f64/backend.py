"""A second, independent implementation for the CPU: float64, sharing no code with reference/.

On a CPU the `torch` backend *is* the oracle, so its rows compare the oracle with itself. This
backend gives the CPU runs something to check: the FP8 cache bytes are parsed by
parse.Fp8Cache from the layout spec (outside the timed call, as other backends convert
layouts), and attention is written out in float64 over each query's gathered keys, all heads
at once. Toy sizes only: it is Python-level per query and per cached token.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dsv4bench.backends.base import Backend, Prepared, Provider
from dsv4bench.backends.f64 import encode
from dsv4bench.backends.f64.parse import Fp8Cache
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output, prefill_output

MAX_QUERIES = 4096  # (query, request) rows; beyond toy sizes this backend declines
MAX_CACHE_TOKENS = 8192


class ReferenceF64(Backend):
    name = "reference-f64"
    description = "float64 attention over its own FP8 byte parser; CPU, toy sizes"
    archs = ("cpu",)
    ops = ("decode", "prefill", "dequant", "remap", "cache_write")
    layouts = ("v32", "v4")  # parse.RECORD_BYTES
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "yes: float64",
        "CUDA graphs": "no: CPU only",
        "batch invariance": "yes: each query row is computed alone, in float64",
    }

    def provider(self) -> Provider:
        return Provider("slow_f64", f"torch {torch.__version__} float64", "dsv4bench/backends")

    def supports(self, case: Case, arch: str) -> str | None:
        reason = super().supports(case, arch)
        if reason:
            return reason
        queries = case.query_tokens
        if queries > MAX_QUERIES or case.batch_size * case.context_len > 4 * MAX_CACHE_TOKENS:
            return f"{self.name} is for toy sizes (at most {MAX_QUERIES} queries)"
        return None

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        x = inputs
        if case.op == "remap" and case.tokens:
            return Prepared(run=lambda: Output(_workspace_remap(x, case)))
        if case.op == "remap" and case.form:
            return Prepared(
                run=lambda: Output(_dcp_remap(x["local_indices"], x["block_table"], case))
            )
        if case.op == "remap":
            return Prepared(run=lambda: Output(_remap(x["local_indices"], x["block_table"], case)))
        if case.op == "cache_write":
            slots = x["slot_mapping"].tolist()
            conv = case.scale_convention
            return Prepared(
                run=lambda: Output(encode.write(x["k_cache"], x["kv"], slots, case.layout, conv))
            )
        if case.op == "dequant":
            cache = Fp8Cache(x["k_cache"], layout=case.layout)
            slots = x["k_cache"].shape[0] * x["k_cache"].shape[1]
            rows = torch.tensor([cache.token(s) for s in range(slots)], dtype=torch.float64)
            return Prepared(run=lambda: Output(rows.clone()))
        if case.op == "prefill" and case.route == "sparse-prefill":
            kv = x["kv"].reshape(x["kv"].shape[0], -1).double()
            rows = x["q"].shape[0]  # a ragged batch: one chunk per request, back to back
            sets = [(kv, x["indices"].reshape(rows, x["indices"].shape[-1]), x.get("topk_length"))]
            queries = x["q"].double()[:, None]  # (tokens, 1, h, d): one query per "request"
            run = _attend(queries, sets, case, x)
            return Prepared(run=run, finish=_prefill_output)
        sets = [_parsed(x["k_cache"], x["indices"], x.get("topk_length"), case.layout)]
        if x.get("extra_k_cache") is not None:
            extra = (x["extra_indices"], x.get("extra_topk_length"), case.layout)
            sets.append(_parsed(x["extra_k_cache"], *extra))
        queries = x["q"].double()
        run = _attend(queries, sets, case, x)
        if case.op == "prefill":  # a decode route: (T, 1) or (1, T) queries
            return Prepared(run=run, finish=_prefill_output)
        return Prepared(run=run)


def _parsed(cache, indices, lengths, layout: str):
    """(keys of every slot the indices name, float64; those indices remapped into it, lengths)."""
    reader = Fp8Cache(cache, layout=layout)
    flat = indices.reshape(-1).tolist()
    slots = sorted({s for s in flat if s != -1})
    where = {s: i for i, s in enumerate(slots)}
    keys = torch.tensor([reader.token(s) for s in slots], dtype=torch.float64)
    local = torch.tensor([where.get(s, -1) for s in flat]).reshape(indices.shape)
    return keys.reshape(len(slots), reader.d), local, lengths


def _attend(q: torch.Tensor, sets, case: Case, x: dict) -> Callable[[], Output]:
    """A call: q (b, s_q, h, d) float64 over the key sets -> out (b, s_q, h, d_v), lse (b, h, s_q).
    Which keys each query reads is worked out here, once; the call does the arithmetic."""
    b, s_q, h, _ = q.shape
    keys = torch.cat([k for k, _, _ in sets])
    picked, offset = [[] for _ in range(b * s_q)], 0
    for k, idx, lengths in sets:
        rows = idx.reshape(b * s_q, idx.shape[-1])  # -1 cannot size a 0-row call
        for n, row in enumerate(rows):
            used = row.shape[-1] if lengths is None else max(0, int(lengths[n // s_q]))
            row = row[:used]
            picked[n].append(row[(row >= 0) & (row < k.shape[0])].long() + offset)
        offset += k.shape[0]
    picked = [torch.cat(p) for p in picked]
    sink = x.get("attn_sink")
    sink = None if sink is None else sink.double()

    def run() -> Output:
        out = torch.zeros(b, s_q, h, case.d_v, dtype=torch.float64)
        lse = torch.full((b, h, s_q), math.inf, dtype=torch.float64)
        for n, slots in enumerate(picked):
            if slots.numel() == 0:
                continue  # no valid key: out 0, lse +inf
            bi, si = divmod(n, s_q)
            k = keys[slots]
            logits = case.scale * (q[bi, si] @ k.T)  # (h, n)
            m = logits.max(dim=1, keepdim=True).values
            row_lse = m[:, 0] + torch.log(torch.exp(logits - m).sum(dim=1))
            o = torch.exp(logits - row_lse[:, None]) @ k[:, : case.d_v]
            if sink is not None:
                o = o * torch.sigmoid(row_lse - sink)[:, None]
            out[bi, si], lse[bi, :, si] = o, row_lse
        return Output(out, lse)

    return run


def _prefill_output(o: Output) -> Output:
    return prefill_output(o.out, o.lse)


def _remap(local: torch.Tensor, table: torch.Tensor, case: Case) -> torch.Tensor:
    """Global slot = block_table[r][i // P] * P + i % P, written out per entry; -1 stays -1."""
    page, rows = case.page_size, table.tolist()
    flat = local.reshape(local.shape[0], -1).tolist()
    out = []
    for r, entries in enumerate(flat):
        for i in entries:
            block = i // page if i >= 0 else -1
            ok = 0 <= block < len(rows[r]) and rows[r][block] >= 0
            out.append(rows[r][block] * page + i % page if ok else -1)
    return torch.tensor(out, dtype=local.dtype).reshape(local.shape)


def _workspace_remap(x: dict, case: Case) -> torch.Tensor:
    """vLLM's prefill form written out per entry: a prefill token's position i -> its request's
    workspace start + i; -1 stays -1 (every token here is a prefill token)."""
    starts = x["workspace_starts"].tolist()
    requests = x["prefill_request"].tolist()
    rows = [
        [starts[requests[t]] + i if i >= 0 else -1 for i in entries]
        for t, entries in enumerate(x["local_indices"].tolist())
    ]
    return torch.tensor(rows, dtype=x["local_indices"].dtype).reshape(x["local_indices"].shape)


def dcp_shard(n: int, ranks: int, rank: int, group: int) -> list[int]:
    """The request positions rank `rank` holds, in order: tokens 0..n-1 dealt to the ranks
    `group` at a time, round-robin."""
    shards: list[list[int]] = [[] for _ in range(ranks)]
    dealer, left = 0, group
    for p in range(n):
        shards[dealer].append(p)
        left -= 1
        if left == 0:
            dealer, left = (dealer + 1) % ranks, group
    return shards[rank]


def _dcp_remap(local: torch.Tensor, table: torch.Tensor, case: Case) -> torch.Tensor:
    """One DCP rank's slots, written out per entry: the rank's shard dealt out, an owned
    position's place in it paged through the rank's block table; anything else -1 (form
    dcp-compact: then each row's slots moved to its front)."""
    page, rows = case.page_size, table.tolist()
    flat = local.reshape(local.shape[0], -1).tolist()
    most = max((i for entries in flat for i in entries), default=-1) + 1
    shard = dcp_shard(most, case.dcp_size, case.dcp_rank, case.dcp_interleave)
    at = {p: j for j, p in enumerate(shard)}
    out = []
    for r, entries in enumerate(flat):
        for i in entries:
            j = at.get(i, -1)
            ok = j >= 0 and j // page < len(rows[r]) and rows[r][j // page] >= 0
            out.append(rows[r][j // page] * page + j % page if ok else -1)
    if case.form == "dcp-compact":  # each row's own slots first, in order, then -1
        k = local.shape[-1]
        out = [v for s in range(0, len(out), k) for v in _front(out[s : s + k])]
    return torch.tensor(out, dtype=local.dtype).reshape(local.shape)


def _front(row: list[int]) -> list[int]:
    kept = [v for v in row if v >= 0]
    return kept + [-1] * (len(row) - len(kept))
