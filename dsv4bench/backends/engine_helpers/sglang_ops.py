"""sglang's helper kernels on the DSA path (sglang 0.5.23), each as sglang calls it, loaded by
sglang_files.py out of a `sglang-ops-<v>` build:

  dequant     V3.2: dsa/dequant_k_cache.py `dequantize_k_cache_paged_dsa` (the FP8 -> bf16
              gather of the sparse-fwd route); V4 and V4.1: dsv4/dequant_k_cache.py
              `dequantize_k_cache_paged_dsv4` with the cache's KVLayout (V4; V41_NEW / V41 for
              the interleaved / block-split V4.1 records, V41_FP4_NEW / V41_FP4 for FP4). Every
              slot in order (page_table_1 = 0..slots-1), as the dequant op asks.
  remap       dsa/transform_index.py `transform_index_page_table_decode`: top-k positions ->
              slots through sglang's per-token page table (page_table_1, page size 1: the block
              table expanded in prepare(), as sglang keeps it); the decode form only (sglang
              has no prefill workspace: its prefill reads global slots).
  page_split  flash_mla_sm120.py `_page_split_kernel` launched as `_split_kv_pages_to_64`
              launches it without a touched-page mask (that function allocates its output in
              sglang's runtime buffers, which this backend does not load).

Option `kv_layout` reads the cache as another sglang KVLayout than the case's (the V4.1
conformance case: an interleaved cache read block-split gives wrong values and no error).
Outputs the API lets a caller give (dsv4 dequant `out`, the remap's `result`, the page split's
destination) are guarded (guard.py).
"""

from __future__ import annotations

import torch

from dsv4bench.backends.base import Prepared, Provider, Unsupported
from dsv4bench.backends.engine_helpers import common, guard, sglang_files
from dsv4bench.cases.case import SPLIT_PAGE, Case
from dsv4bench.cases.output import Output

PLACE = common.BuildPlace(
    "sglang's DSA helper kernels",
    "sglang-ops-*/",
    "dsv4bench kernels fetch sglang",
    sglang_files.FILES,
    "sglang-ops",
)
# the suite's layout -> sglang's KVLayout value (dsv4/kv_layout.py)
KV_LAYOUTS = {
    "v4": "v4",
    "v41": "v41_new",
    "v41-blocks": "v41",
    "v41-fp4": "v41_fp4_new",
    "v41-fp4-blocks": "v41_fp4",
}
V41_LAYOUTS = tuple(k for k in KV_LAYOUTS if k.startswith("v41"))
SPLIT_PAGE_BYTES = 37440  # flash_mla_sm120._BYTES_PER_DST_PAGE_PADDED


def load(lib: str | None):
    reason = PLACE.missing_reason(lib)
    if reason:
        raise Unsupported(reason)
    folder = PLACE.folder(lib)
    files = sglang_files.files(folder)
    for rel in sglang_files.FILES:
        files.module(rel)  # every file loads, or the reason says which does not
    provider = Provider("sglang DSA helper kernels", common.version_of(folder), str(folder))
    return provider, files


class SglangOps(common.HelperBackend):
    place = PLACE
    name = "sglang-ops"
    description = "sglang's DSA helper kernels: FP8 dequant, top-k page-table remap, page split"
    archs = ("sm90", "sm100", "sm120")  # CPU tests: Triton's interpreter
    ops = ("dequant", "remap", "page_split")
    layouts = ("v32", *KV_LAYOUTS)
    options = {"lib": None, "kv_layout": ""}
    capabilities = {
        "lse out": "no: cache and index helpers",
        "CUDA graphs": "dsv4 dequant, remap and page split: yes (caller-given outputs); the DSA "
        "dequant allocates its output per call",
        "batch invariance": "yes: elementwise per token or per row",
    }

    def __init__(self, lib: str | None = None, kv_layout: str = "", ops=None):
        """lib: a `sglang-ops-<v>` build folder (None: discover). kv_layout: a sglang KVLayout
        value to read V4/V4.1 caches as ("": the case's). ops: injected (Provider, Files)."""
        if kv_layout and kv_layout not in KV_LAYOUTS.values():
            raise ValueError(f"kv_layout {kv_layout!r} (one of {', '.join(KV_LAYOUTS.values())})")
        self.kv_layout = kv_layout
        self._find_with(lib, ops, load)

    def case_reason(self, case: Case, arch: str = "cpu") -> str | None:
        if case.op == "remap" and case.tokens:
            return "sglang maps prefill top-k to global slots: it has no prefill workspace form"
        if case.op == "remap" and case.form:
            return "sglang's transform_index_page_table has no DCP form (one rank's slots)"
        if case.op == "page_split" and case.layout != "v4":
            return f"sglang's page split re-pages V4 caches, not layout {case.layout}"
        if case.op == "dequant" and case.layout in V41_LAYOUTS and arch in ("sm90", "sm120"):
            return "sglang 0.5.23's dequantize_k_cache_paged_v41 refuses below SM100 (its check)"
        return None

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        reason = self.case_reason(case)
        if reason:
            raise Unsupported(reason)
        files = self.kernel_ops()[1]
        if case.op == "dequant" and case.layout == "v32":
            return _dequant_dsa(case, inputs, files)
        if case.op == "dequant":
            return self._dequant_dsv4(case, inputs, files)
        if case.op == "remap":
            return _remap(case, inputs, files)
        return _page_split(case, inputs, files)

    def _dequant_dsv4(self, case: Case, x: dict, files) -> Prepared:
        fn = files.module("dsv4/dequant_k_cache.py").dequantize_k_cache_paged_dsv4
        cache = _page_rows(x["k_cache"])
        slots = cache.shape[0] * case.page_size
        table = torch.arange(slots, dtype=torch.int32, device=cache.device)
        out = guard.Guarded.empty((slots, 1, 512), torch.bfloat16, cache.device, "its output")
        layout = self.kv_layout or KV_LAYOUTS[case.layout]
        run = lambda: fn(cache, table, case.page_size, out=out.tensor, layout=layout)  # noqa: E731
        run()
        info = {"kernel": "sglang dequantize_k_cache_paged_dsv4", "kv_layout": layout}
        poison = lambda: out.tensor.fill_(float("nan"))  # noqa: E731
        return Prepared(run, _finish(out, lambda t: t[:, 0]), poison, info, buffers=(cache, table))


def _page_rows(cache: torch.Tensor) -> torch.Tensor:
    """(num_pages, page stride) bytes: the paged view sglang's dsv4 kernels take."""
    stride = cache.stride(0)
    flat = cache.view(torch.uint8)
    return torch.as_strided(flat, (cache.shape[0], stride), (stride, 1), cache.storage_offset())


def _finish(out: guard.Guarded, shape):
    def finish(_) -> Output:
        out.check()
        return Output(shape(out.tensor).clone())

    return finish


def _dequant_dsa(case: Case, x: dict, files) -> Prepared:
    fn = files.module("dsa/dequant_k_cache.py").dequantize_k_cache_paged_dsa
    cache = x["k_cache"].view(torch.float8_e4m3fn)
    slots = cache.shape[0] * cache.shape[1]
    table = torch.arange(slots, dtype=torch.int32, device=cache.device)
    run = lambda: fn(cache, table)  # noqa: E731
    run()
    info = {"kernel": "sglang dequantize_k_cache_paged_dsa", "guard": "none: it allocates"}
    return Prepared(run, lambda got: Output(got[:, 0]), None, info, buffers=(cache, table))


def _remap(case: Case, x: dict, files) -> Prepared:
    fn = files.module("dsa/transform_index.py").transform_index_page_table_decode
    local, table = x["local_indices"], x["block_table"].long()
    b, s_q, topk = local.shape
    positions = torch.arange(table.shape[1] * case.page_size, device=table.device)
    per_token = table[:, positions // case.page_size] * case.page_size + positions % case.page_size
    page_table = per_token.repeat_interleave(s_q, dim=0).to(torch.int32).contiguous()
    rows = local.reshape(b * s_q, topk).to(torch.int32).contiguous()
    out = guard.Guarded.empty((b * s_q, topk), torch.int32, rows.device, "its result")
    run = lambda: fn(page_table, rows, result=out.tensor)  # noqa: E731
    run()
    info = {"kernel": "sglang transform_index_page_table_decode", "page_table": "per token"}
    poison = lambda: out.tensor.fill_(-2)  # noqa: E731
    finish = _finish(out, lambda t: t.view(b, s_q, topk))
    return Prepared(run, finish, poison, info, buffers=(page_table, rows))


def _page_split(case: Case, x: dict, files) -> Prepared:
    m = files.module("flash_mla_sm120.py")
    src = _page_rows(x["k_cache"])
    n, ratio = src.shape[0], case.page_size // SPLIT_PAGE
    if m._BYTES_PER_DST_PAGE_PADDED != SPLIT_PAGE_BYTES:
        raise Unsupported(f"sglang's split page is {m._BYTES_PER_DST_PAGE_PADDED} bytes, not 37440")
    out = guard.Guarded.empty((n * ratio, SPLIT_PAGE_BYTES), torch.uint8, src.device, "its pages")
    dst = out.tensor
    args = (src, dst, n, src.stride(0), SPLIT_PAGE_BYTES, SPLIT_PAGE * 576, SPLIT_PAGE * 8)
    args += (case.page_size * 576, SPLIT_PAGE * 576, ratio, 1024, src, False)

    def run():
        m._page_split_kernel[(n * ratio,)](*args)
        return dst

    run()

    def view(t):
        return t.as_strided((n * ratio, SPLIT_PAGE, 1, 584), (SPLIT_PAGE_BYTES, 584, 584, 1))

    info = {"kernel": "sglang _page_split_kernel (as _split_kv_pages_to_64 launches it)"}
    poison = lambda: dst.fill_(0xFF)  # noqa: E731
    return Prepared(run, _finish(out, view), poison, info, buffers=(src,))
