"""vLLM's `_C` ops on the DSA path (vLLM 0.33.0, vllm/_C_stable_libtorch.abi3.so, built on the
stable libtorch ABI), loaded with torch.ops.load_library out of a `vllm-ops-<v>` build and
called as vllm/_custom_ops.py and vllm/model_executor/layers/indexer_topk.py call them:

  cache_write  _C_cache_ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping,
               "fp8_ds_mla", scale, False): V3.2's 656-byte records (0.33.0 on H100: the
               pow2 convention byte for byte, not raw amax / 448)
  dequant      _C_cache_ops.cp_gather_and_upconvert_fp8_kv_cache(src, dst, block_table,
               workspace_starts, batch_size, None): one request of every slot in order, or
               (tokens > 0) per chunk of vLLM's chunked prefill (vllm_c_indexer.py)
  indexer-fp8  the indexer's key cache: cache_write indexer_k_quant_and_cache, dequant
               cp_gather_indexer_k_quant_cache (vllm_c_indexer.py)
  v41-fp4      declared to answer why not: cp_gather_and_upconvert_nvfp4_kv_cache reads
               nvfp4_ds_mla's 352-byte records, a layout the oracle does not hold (SM100 only)
  topk         (plain form) option `kernel`: "per-row" _C.top_k_per_row_decode (decode rows,
               next_n 1 with each row's length) / _C.top_k_per_row_prefill (a chunk: row
               starts and ends); "persistent" _C.persistent_topk and "cooperative"
               _C.cooperative_topk (their 1 MiB workspace, RADIX_TOPK_WORKSPACE_SIZE)

Each op's schema is checked against SCHEMAS (the strings the library registers, read from
the 0.33.0 binary) before a call: a release that changed one answers `unsupported` naming it.
A library that does not load (no CUDA, another torch's ABI) answers `unsupported` with the
loader's own words (the missing library or symbol). Every output buffer, the cache the writer
writes in place included, is guarded (guard.py).
"""

from __future__ import annotations

import torch

from dsv4bench.backends.base import Prepared, Provider, Unsupported
from dsv4bench.backends.engine_helpers import common, guard, vllm_c_indexer
from dsv4bench.cases import indexer_case
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

SO = "_C_stable_libtorch.abi3.so"
PLACE = common.BuildPlace(
    "vLLM's _C library", "vllm-ops-*/", "dsv4bench kernels fetch 'vllm[ops]'", (SO,), "vllm-ops"
)
SCHEMAS = {
    "_C_cache_ops.concat_and_cache_mla": "concat_and_cache_mla(Tensor kv_c, Tensor k_pe, "
    "Tensor! kv_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor scale, "
    "bool skip_scale=False) -> ()",
    "_C_cache_ops.cp_gather_and_upconvert_fp8_kv_cache": "cp_gather_and_upconvert_fp8_kv_cache("
    "Tensor src_cache, Tensor! dst, Tensor block_table, Tensor workspace_starts, "
    "int batch_size, Tensor? seq_starts, Tensor? host_cache=None, Tensor? host_row_ids=None, "
    "Tensor? device_row_ids=None) -> ()",
    "_C_cache_ops.indexer_k_quant_and_cache": "indexer_k_quant_and_cache(Tensor k, "
    "Tensor! kv_cache, Tensor slot_mapping, int quant_block_size, str kv_cache_dtype) -> ()",
    "_C_cache_ops.cp_gather_indexer_k_quant_cache": "cp_gather_indexer_k_quant_cache("
    "Tensor kv_cache, Tensor! dst_k, Tensor! dst_scale, Tensor block_table, "
    "Tensor cu_seq_lens) -> ()",
    "_C_cache_ops.cp_gather_and_upconvert_nvfp4_kv_cache": "cp_gather_and_upconvert_nvfp4_kv_"
    "cache(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor workspace_starts, "
    "int batch_size) -> ()",
    "_C.top_k_per_row_prefill": "top_k_per_row_prefill(Tensor logits, Tensor rowStarts, "
    "Tensor rowEnds, Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()",
    "_C.top_k_per_row_decode": "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, "
    "Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()",
    "_C.persistent_topk": "persistent_topk(Tensor logits, Tensor lengths, Tensor! output, "
    "Tensor workspace, int k, int max_seq_len) -> ()",
    "_C.cooperative_topk": "cooperative_topk(Tensor logits, Tensor lengths, Tensor! output, "
    "Tensor workspace, int k, int max_seq_len) -> ()",
}
KERNELS = ("per-row", "persistent", "cooperative")
INDEXER = "indexer-fp8"
COOPERATIVE_MAX_ROWS = 64  # csrc/cooperative_topk.cu refuses more rows (vLLM 0.33.0)
TOPK_WORKSPACE = 1024 * 1024  # indexer_topk.RADIX_TOPK_WORKSPACE_SIZE
REASON_CHARS = 400


def canonical(schema: str) -> str:
    """The schema as torch prints it, without its namespace."""
    return str(torch._C.parse_schema(schema)).split("::", 1)[-1]


def load(lib: str | None):
    """(Provider, the op table: a callable op_name -> op), the library loaded once."""
    reason = PLACE.missing_reason(lib)
    if reason:
        raise Unsupported(reason)
    so = (PLACE.folder(lib) / SO).resolve()
    try:
        torch.ops.load_library(str(so))
    except (OSError, RuntimeError) as e:
        why = f"vLLM's {SO} does not load here (torch {torch.__version__}): {_dlerror(so) or e}"
        raise Unsupported(why[:REASON_CHARS]) from e
    provider = Provider("vllm _C ops", common.version_of(so.parent), str(so))
    return provider, lambda name: getattr(
        getattr(torch.ops, name.split(".")[0]), name.split(".")[1]
    )


def _dlerror(so) -> str:
    """The dynamic loader's own words (the missing library or undefined symbol)."""
    import ctypes

    try:
        ctypes.CDLL(str(so))
    except OSError as e:
        return str(e)
    return ""


def checked(table, name: str):
    """The op, its schema as SCHEMAS says; else Unsupported naming the difference."""
    try:
        op = table(name)
        found = str(op.default._schema).split("::", 1)[-1]
    except (AttributeError, RuntimeError) as e:
        raise Unsupported(f"vLLM's _C has no {name} ({e})"[:REASON_CHARS]) from e
    if found != canonical(SCHEMAS[name]):
        raise Unsupported(f"vLLM's {name} schema changed: {found}"[:REASON_CHARS])
    return op


class VllmOps(common.HelperBackend):
    place = PLACE
    name = "vllm-ops"
    description = (
        "vLLM's _C ops: the fp8_ds_mla and indexer-key writers, gather+upconvert (chunked "
        "prefill too), the indexer-key gather, the indexer top-k"
    )
    archs = ("sm90", "sm100")
    ops = ("cache_write", "dequant", "topk")
    layouts = ("v32", INDEXER, "v41-fp4")
    chunked_gather = True
    options = {"lib": None, "kernel": "per-row"}
    capabilities = {
        "lse out": "no: cache and top-k helpers",
        "CUDA graphs": "yes: caller-given outputs",
        "batch invariance": "per row (top-k), per token (cache ops)",
    }

    def __init__(self, lib: str | None = None, kernel: str = "per-row", ops=None):
        """lib: a `vllm-ops-<v>` build folder (None: discover). kernel: the top-k (KERNELS).
        ops: injected (Provider, op table)."""
        if kernel not in KERNELS:
            raise ValueError(f"kernel {kernel!r} (one of {', '.join(KERNELS)})")
        self.kernel = kernel
        if kernel != "per-row":  # an instance for the top-k: its cache ops are vllm-ops's own rows
            self.ops = ("topk",)
        self._find_with(lib, ops, load)

    def case_reason(self, case: Case, arch: str = "cpu") -> str | None:
        if case.layout == "v41-fp4" and case.op in ("cache_write", "dequant"):
            return vllm_c_indexer.NVFP4_REASON
        writes_keys = case.layout == INDEXER and case.op == "cache_write"
        if writes_keys and case.scale_convention not in vllm_c_indexer.SCALE_FMT:
            return f"vLLM's indexer writer has no scale convention {case.scale_convention}"
        if case.op == "topk" and case.form != "plain":
            return f"vLLM's top-k ops return column indices (form plain), not form {case.form}"
        if case.op == "topk" and self.kernel != "per-row" and case.topk not in (512, 1024, 2048):
            return f"vLLM's {self.kernel}_topk takes k 512, 1024 or 2048, not {case.topk}"
        rows = indexer_case.rows(case) if case.op == "topk" else 0
        if self.kernel == "cooperative" and rows > COOPERATIVE_MAX_ROWS:
            return (
                f"vLLM's cooperative_topk takes at most {COOPERATIVE_MAX_ROWS} rows, not {rows} "
                "(its own check, cooperative_topk.cu; persistent_topk takes more)"
            )
        return None

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        reason = self.case_reason(case)
        if reason:
            raise Unsupported(reason)
        table = self.kernel_ops()[1]
        if case.op == "cache_write" and case.layout == INDEXER:
            op = checked(table, "_C_cache_ops.indexer_k_quant_and_cache")
            return vllm_c_indexer.indexer_write(case, inputs, op)
        if case.op == "cache_write":
            return _cache_write(case, inputs, checked(table, "_C_cache_ops.concat_and_cache_mla"))
        if case.op == "dequant" and case.layout == INDEXER:
            op = checked(table, "_C_cache_ops.cp_gather_indexer_k_quant_cache")
            return vllm_c_indexer.indexer_gather(case, inputs, op)
        if case.op == "dequant":
            op = checked(table, "_C_cache_ops.cp_gather_and_upconvert_fp8_kv_cache")
            return vllm_c_indexer.upconvert_chunks(case, inputs, op)
        return _topk(case, inputs, table, self.kernel)


def _cache_write(case: Case, x: dict, op) -> Prepared:
    kv = x["kv"]
    kv_c, k_pe = kv[:, : case.d_v].contiguous(), kv[:, case.d_v :].contiguous()
    cache = guard.Guarded.copy_of(x["k_cache"], "its cache")
    original = cache.inner_bytes().clone()
    pages, page_size = cache.tensor.shape[:2]
    kv_cache = cache.tensor.view(pages, page_size, -1)
    slots = x["slot_mapping"].to(torch.int64)
    scale = torch.ones(1, dtype=torch.float32, device=kv.device)
    run = lambda: op(kv_c, k_pe, kv_cache, slots, "fp8_ds_mla", scale, False)  # noqa: E731

    def finish(_) -> Output:
        cache.check()
        return Output(cache.inner_bytes().clone())

    poison = lambda: cache.inner_bytes().copy_(original)  # noqa: E731 - the cache as it came
    info = {"kernel": "vllm concat_and_cache_mla (fp8_ds_mla)"}
    return Prepared(run, finish, poison, info, buffers=(kv_c, k_pe, slots))


def _topk(case: Case, x: dict, table, kernel: str) -> Prepared:
    logits, lengths = x["logits"], x["lengths"].to(torch.int32).contiguous()
    rows, k = logits.shape[0], case.topk
    out = guard.Guarded.empty((rows, k), torch.int32, logits.device, "its indices")
    s0, s1 = logits.stride()
    if kernel != "per-row":
        op = checked(table, f"_C.{kernel}_topk")
        work = torch.zeros(TOPK_WORKSPACE, dtype=torch.uint8, device=logits.device)
        longest = int(lengths.max()) if rows else 0
        run = lambda: op(logits, lengths, out.tensor, work, k, longest)  # noqa: E731
        name = f"vllm {kernel}_topk"
    elif case.tokens:
        op = checked(table, "_C.top_k_per_row_prefill")
        starts = x["row_starts"].to(torch.int32).contiguous()
        ends = starts + lengths
        run = lambda: op(logits, starts, ends, out.tensor, rows, s0, s1, k)  # noqa: E731
        name = "vllm top_k_per_row_prefill"
    else:
        op = checked(table, "_C.top_k_per_row_decode")
        run = lambda: op(logits, 1, lengths, out.tensor, rows, s0, s1, k)  # noqa: E731
        name = "vllm top_k_per_row_decode (next_n 1: each row's length)"

    def finish(_) -> Output:
        out.check()
        return Output(out.tensor.clone())

    poison = lambda: out.tensor.fill_(-3)  # noqa: E731
    return Prepared(run, finish, poison, {"kernel": name}, buffers=(logits, lengths))
