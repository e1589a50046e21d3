"""vLLM's Triton index remap as FlashMLASparse calls it (vLLM 0.33.0,
vllm/v1/attention/backends/mla/flashmla_sparse.py): `triton_convert_req_index_to_global_index`
with return_valid_counts=True (valid slots compacted to the front, one count per row), over
the decode form (every row a decode token: global slots) or the prefill form (every row a
prefill token: rows of the sparse-prefill workspace, HAS_PREFILL_WORKSPACE with the per-chunk
workspace starts). The file is vLLM's, loaded by vllm_files.py out of a `vllm-triton-<v>` build.

Outputs go into guarded buffers (guard.py) handed to the wrapper as `out=` and
`valid_counts_out=`; the counts are checked against the slots the row holds. The compaction is
stable in one tile (widths up to 4096), so with the suite's valid-first rows the answer is
positional, as the oracle's.
"""

from __future__ import annotations

import torch

from dsv4bench.backends.base import Prepared, Provider, Unsupported
from dsv4bench.backends.engine_helpers import common, guard, vllm_files
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

PLACE = common.BuildPlace(
    "vLLM's Triton index remap",
    "vllm-triton-*/",
    "dsv4bench kernels fetch 'vllm[ops]'",
    vllm_files.FILES,
    "vllm-triton",
)
FUNCTION = "triton_convert_req_index_to_global_index"
DCP_FUNCTION = "triton_filter_and_convert_dcp_index"  # the remap's form dcp
BLOCK_N = 128  # vLLM's default column tile
POISON = -2  # neither -1 nor a slot
SINGLE_TILE_MAX = 4096  # _remap_tiling: one program per row up to this width (stable compaction)


class CountsDisagree(RuntimeError):
    """The kernel's valid counts are not the number of slots its rows hold."""


def block_n(topk: int) -> int:
    """vLLM's BLOCK_N (128) where it divides the width, else the largest power of two that does
    (the wrapper asserts NUM_TOPK_TOKENS % BLOCK_N == 0)."""
    if topk % BLOCK_N == 0:
        return BLOCK_N
    return topk & -topk


def load(lib: str | None):
    reason = PLACE.missing_reason(lib)
    if reason:
        raise Unsupported(reason)
    folder = PLACE.folder(lib)
    module = vllm_files.sparse_utils(folder)
    fn = getattr(module, FUNCTION, None)
    if fn is None:
        raise Unsupported(f"vLLM's sparse_utils.py has no {FUNCTION} (another vLLM API?)")
    where = str((folder / vllm_files.SPARSE_UTILS).resolve())
    provider = Provider(f"vllm {FUNCTION}", common.version_of(folder), where)
    return provider, fn, getattr(module, DCP_FUNCTION, None)


class VllmTriton(common.HelperBackend):
    place = PLACE
    name = "vllm-triton"
    description = "vLLM's Triton index remap (global slots, prefill workspace rows)"
    archs = ("sm90", "sm100", "sm120")  # CPU tests: Triton's interpreter
    ops = ("remap",)
    options = {"lib": None}
    capabilities = {
        "lse out": "no: an index remap",
        "CUDA graphs": "yes: the call is the kernel, its buffers made in prepare()",
        "batch invariance": "yes: one program per query row",
    }

    def __init__(self, lib: str | None = None, ops=None):
        """lib: a `vllm-triton-<v>` build folder (None: discover). ops: injected
        (Provider, function[, the DCP function])."""
        self._find_with(lib, ops, load)

    def case_reason(self, case: Case, arch: str = "cpu") -> str | None:
        if case.form == "dcp":  # in place, no compaction: any width BLOCK_N tiles
            return self._dcp_reason()
        if case.topk > SINGLE_TILE_MAX:  # the plain, prefill and dcp-compact calls compact
            return f"vLLM compacts rows wider than {SINGLE_TILE_MAX} across tiles, unordered"
        return self._dcp_reason() if case.form else None

    def _dcp_reason(self) -> str | None:
        """A build whose sparse_utils.py lacks the DCP function declines form dcp alone (a
        build that does not load answers with its own reason)."""
        try:
            ops = self.kernel_ops()
        except Unsupported:
            return None
        if len(ops) < 3 or ops[2] is None:
            return f"vLLM's sparse_utils.py has no {DCP_FUNCTION} (another vLLM API?)"
        return None

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        reason = self.case_reason(case)
        if reason:
            raise Unsupported(reason)
        ops = self.kernel_ops()
        if case.form:  # dcp, dcp-compact
            return prepare_dcp(case, inputs, ops[2] if len(ops) > 2 else None)
        fn = ops[1]
        x = inputs
        local = x["local_indices"]
        shape = local.shape
        rows = local.reshape(-1, case.topk).to(torch.int32).contiguous()
        t = rows.shape[0]
        kw = dict(BLOCK_SIZE=case.page_size, NUM_TOPK_TOKENS=case.topk, BLOCK_N=block_n(case.topk))
        if case.tokens:  # the prefill form: every row a prefill token
            req = x["req_of_token"].to(torch.int32).contiguous()
            kw.update(
                HAS_PREFILL_WORKSPACE=True,
                prefill_workspace_request_ids=x["prefill_request"].to(torch.int32).contiguous(),
                prefill_workspace_starts=x["workspace_starts"].to(torch.int32).contiguous(),
            )
        else:
            b, s_q = shape[0], shape[1]
            req = torch.arange(b, dtype=torch.int32, device=rows.device).repeat_interleave(s_q)
        table = x["block_table"].to(torch.int32).contiguous()
        out = guard.Guarded.empty((t, case.topk), torch.int32, rows.device, "its index output")
        counts = guard.Guarded.empty((t,), torch.int32, rows.device, "its valid counts")

        def run():
            return fn(
                req, table, rows, **kw, return_valid_counts=True,
                out=out.tensor, valid_counts_out=counts.tensor,
            )  # fmt: skip

        def finish(_) -> Output:
            guard.check_all(out, counts)
            held = (out.tensor >= 0).sum(-1).to(torch.int32)
            if not torch.equal(held, counts.tensor):
                bad = int((held != counts.tensor).sum())
                raise CountsDisagree(f"{bad} of {t} rows' valid counts differ from their slots")
            return Output(out.tensor.clone().view(shape))

        info = {"kernel": f"vllm {FUNCTION}", "block_n": kw["BLOCK_N"]}
        info["form"] = "prefill workspace" if case.tokens else "global slots"
        run()  # Triton compiles on the first call, outside the timed one
        poison = lambda: out.tensor.fill_(POISON)  # noqa: E731 - a kernel writing nothing fails
        return Prepared(run, finish, poison, info, buffers=(req, table, rows))


def prepare_dcp(case: Case, x: dict, fn) -> Prepared:
    """`triton_filter_and_convert_dcp_index` as vLLM 0.33.0 calls it under DCP. Form dcp:
    FlashMLASparse's mixed batch (compact_valid_to_front=False, no counts: the other ranks'
    entries stay -1 in place); form dcp-compact: SparseMLACommonImpl.forward_mqa, the
    FlashAttn/FlashInfer sparse backends' (return_valid_counts=True, compaction by default;
    the counts checked against the slots each row holds). BLOCK_STRIDE_ROWS is the page (a
    cache of this layer's pages alone). It allocates its outputs itself (torch.empty_like), so
    no guard bytes surround them; poison() fills the last output and lets it go, so the next
    call's allocation most likely gets those bytes."""
    if fn is None:
        raise Unsupported(f"vLLM's sparse_utils.py has no {DCP_FUNCTION} (another vLLM API?)")
    local = x["local_indices"]
    shape = local.shape
    rows = local.reshape(-1, case.topk).to(torch.int32).contiguous()
    req = torch.arange(shape[0], dtype=torch.int32, device=rows.device)
    req = req.repeat_interleave(shape[1])
    table = x["block_table"].to(torch.int32).contiguous()
    kw = dict(
        dcp_size=case.dcp_size,
        dcp_rank=case.dcp_rank,
        cp_kv_cache_interleave_size=case.dcp_interleave,
        BLOCK_SIZE=case.page_size,
        BLOCK_STRIDE_ROWS=case.page_size,
        NUM_TOPK_TOKENS=case.topk,
        BLOCK_N=block_n(case.topk),
    )
    compact = case.form == "dcp-compact"
    if compact:  # SparseMLACommonImpl's call: counts, the default compaction
        kw["return_valid_counts"] = True
    else:  # FlashMLASparse's
        kw["compact_valid_to_front"] = False
    last: list[torch.Tensor] = []

    def run():
        got = fn(req, table, rows, **kw)
        last[:] = [got[0] if compact else got]
        return got

    def poison():
        if last:
            last.pop().fill_(POISON)

    def finish(got) -> Output:
        out = got[0] if compact else got
        if compact:
            held = (out >= 0).sum(-1).to(torch.int32)
            if not torch.equal(held, got[1]):
                bad = int((held != got[1]).sum())
                raise CountsDisagree(
                    f"{bad} of {len(held)} rows' valid counts differ from their slots"
                )
        return Output(out.clone().view(shape))

    info = {"kernel": f"vllm {DCP_FUNCTION}", "block_n": kw["BLOCK_N"], "form": case.form}
    info["output"] = "the function's own allocation: no guard bytes"
    run()  # Triton compiles on the first call, outside the timed one
    return Prepared(run, finish, poison, info, buffers=(req, table, rows))
