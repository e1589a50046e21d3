"""vLLM's DeepSeek V4 / V4.1 FP8 cache writers and gathers, the Triton kernels of
vllm/models/deepseek_v4{,1}/common/ops/cache_utils.py (vLLM 0.33.0), called as vLLM calls them
and loaded by vllm_cache_files.py out of a `vllm-triton-<v>` build:

  cache_write  quantize_and_insert_k_cache(k bf16 [N, 512], k_cache [num_blocks, block bytes]
               uint8 (stride(0) the padded page), slot_mapping int64 (-1 skipped),
               block_size=page_size), as vLLM's XPU insert calls it (`view(num_blocks, -1)`); the
               V4.1 file's with bytes_per_token 584 (V4's record) or 528 (V4.1's MXFP8 record).
               Scales: 2^ceil(log2(max(amax, 1e-4) / 448)), the oracle's `vllm` convention.
  dequant      dequantize_and_gather_k_cache(out bf16 [requests, tokens, 512], k_cache
               [num_blocks, block_size, record bytes], seq_lens, gather_lens=None, block_table,
               block_size, offset=0), as the FlashMLA sparse backend gathers a chunk's compressed
               cache: one request per batch entry (its pages in order; every slot in order is the
               oracle's workspace), one request of every slot where the pages do not split evenly.
               The V4.1 file picks the kernel by the record width (584: per-block, or one-pass as
               on ROCm with option gather; 528: MXFP8; 288: NVFP4).

Option `model` picks the file (deepseek_v4's, the default, or deepseek_v41's). The cache the
writer writes in place and the gather's output are guarded (guard.py). Where vLLM's CuteDSL
gather is installed vLLM takes it instead of this Triton one (vllm_cache_files.py).
"""

from __future__ import annotations

import torch

from dsv4bench.backends.base import Prepared, Provider, Unsupported
from dsv4bench.backends.engine_helpers import common, guard, vllm_cache_files
from dsv4bench.backends.engine_helpers.interpreted import on_device
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

PLACE = common.BuildPlace(
    "vLLM's V4 Triton cache ops",
    "vllm-triton-*/",
    "dsv4bench kernels fetch 'vllm[ops]'",
    tuple(vllm_cache_files.FILES.values()),
    "vllm-v4-cache",
)
MODELS = ("v4", "v41")
GATHERS = ("per-block", "one-pass")  # the V4.1 file's V4 gather: CUDA's pick, ROCm's pick
RECORD_BYTES = {"v4": 584, "v41": 528, "v41-fp4": 288}
D_QK = 512
WRITES = {"v4": ("v4",), "v41": ("v4", "v41")}
READS = {"v4": ("v4",), "v41": ("v4", "v41", "v41-fp4")}
_INTERLEAVED = (
    "vLLM 0.33.0's V4.1 records are interleaved (a token's scales right after its own data); "
    "{0} is the block-split page FlashMLA read before 2026.09.30"
)
REFUSED = {
    "v32": "V3.2's 656-byte records are vLLM's _C ops' (concat_and_cache_mla, "
    "cp_gather_and_upconvert: backend vllm-ops), not the V4 Triton cache ops'",
    "v32-nope": "vLLM's V4 Triton cache ops take ue8m0/e4m3-scaled V4 and V4.1 records, not "
    "v32-nope's fp32-scaled ones",
    "v41-blocks": _INTERLEAVED.format("v41-blocks"),
    "v41-fp4-blocks": _INTERLEAVED.format("v41-fp4-blocks"),
}
FP4_WRITER = (
    "vLLM 0.33.0 writes V4.1 FP4 records only fused with its compressor "
    "(fused_compress_quant_cache.py, _rope_quant_insert_nvfp4_kernel), not in cache_utils.py"
)


def load(lib: str | None, model: str, rocm: bool):
    reason = PLACE.missing_reason(lib)
    if reason:
        raise Unsupported(reason)
    folder = PLACE.folder(lib)
    module = vllm_cache_files.cache_utils(folder, model, rocm)
    for fn in ("quantize_and_insert_k_cache", "dequantize_and_gather_k_cache"):
        if not callable(getattr(module, fn, None)):
            raise Unsupported(f"vLLM's deepseek_{model} cache_utils.py has no {fn} (another API?)")
    where = str((folder / vllm_cache_files.FILES[model]).resolve())
    return Provider(f"vllm deepseek_{model} cache_utils", common.version_of(folder), where), module


class VllmV4Cache(common.HelperBackend):
    place = PLACE
    name = "vllm-v4-cache"
    description = "vLLM's DeepSeek V4/V4.1 Triton FP8 cache writers and gathers"
    archs = ("sm90", "sm100", "sm120")  # CPU tests: Triton's interpreter
    ops = ("cache_write", "dequant")
    layouts = READS["v4"]
    options = {"lib": None, "model": "v4", "gather": "per-block"}
    capabilities = {
        "lse out": "no: cache writers and gathers",
        "CUDA graphs": "yes: caller-given outputs, the cache written in place",
        "batch invariance": "yes: one program per token (writer), per request (gather)",
    }

    def __init__(
        self, lib: str | None = None, model: str = "v4", gather: str = "per-block", ops=None
    ):
        """lib: a `vllm-triton-<v>` build folder (None: discover). model: whose cache_utils.py
        (MODELS). gather: the V4.1 file's V4 gather kernel (GATHERS; one-pass is ROCm's pick,
        such an instance has that gather alone). ops: injected (Provider, module)."""
        if model not in MODELS:
            raise ValueError(f"model {model!r} (one of {', '.join(MODELS)})")
        if gather not in GATHERS:
            raise ValueError(f"gather {gather!r} (one of {', '.join(GATHERS)})")
        if gather == "one-pass" and model != "v41":
            raise ValueError(
                "gather 'one-pass' is in deepseek_v41's cache_utils.py only (model v41)"
            )
        self.model, self.gather = model, gather
        self.layouts = READS[model]
        if gather == "one-pass":
            self.ops, self.layouts = ("dequant",), ("v4",)
        rocm = gather == "one-pass"
        self._find_with(lib, ops, lambda where: load(where, model, rocm))

    def supports(self, case: Case, arch: str) -> str | None:
        """A layout these kernels do not take says why before the generic layout reason."""
        own = self.case_reason(case, arch) if case.op in self.ops else None
        return own or super().supports(case, arch)

    def case_reason(self, case: Case, arch: str = "cpu") -> str | None:
        if case.layout in REFUSED:
            return REFUSED[case.layout]
        if case.op == "cache_write" and case.layout == "v41-fp4":
            return FP4_WRITER
        takes = WRITES[self.model] if case.op == "cache_write" else self.layouts
        if case.layout not in takes and case.layout in RECORD_BYTES:
            verb = "writes" if case.op == "cache_write" else f"gathers ({self.gather})"
            where = f"vLLM's deepseek_{self.model} cache_utils.py"
            return f"{where} {verb} {' and '.join(takes)} records only, not {case.layout}"
        return None

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        reason = self.case_reason(case)
        if reason:
            raise Unsupported(reason)
        module = self.kernel_ops()[1]
        if case.op == "cache_write":
            return _cache_write(case, inputs, module, self.model)
        return _dequant(case, inputs, module, self.model, self.gather)


def _cache_write(case: Case, x: dict, module, model: str) -> Prepared:
    kv = x["kv"].to(torch.bfloat16).contiguous()
    slots = x["slot_mapping"].to(torch.int64).contiguous()
    cache = guard.Guarded.copy_of(x["k_cache"], "its cache")
    original = cache.inner_bytes().clone()
    pages, page_size = cache.tensor.shape[:2]
    stride = cache.tensor.stride(0)
    blocks = torch.as_strided(  # [num_blocks, block bytes]: vLLM's view(num_blocks, -1)
        cache.tensor.view(torch.uint8), (pages, stride), (stride, 1), cache.tensor.storage_offset()
    )
    kw = {"block_size": page_size}
    if model == "v41":
        kw["bytes_per_token"] = RECORD_BYTES[case.layout]
    run = on_device(lambda: module.quantize_and_insert_k_cache(kv, blocks, slots, **kw), kv.device)

    def finish(_) -> Output:
        cache.check()
        return Output(cache.inner_bytes().clone())

    poison = lambda: cache.inner_bytes().copy_(original)  # noqa: E731 - the cache as it came
    info = {
        "kernel": f"vllm deepseek_{model} quantize_and_insert_k_cache",
        "record_bytes": RECORD_BYTES[case.layout],
        "scale_convention": case.scale_convention,
    }
    run()  # Triton compiles on the first call, outside the timed one
    return Prepared(run, finish, poison, info, buffers=(kv, slots))


def requests_of(case: Case, pages: int) -> int:
    """Requests the gather is called with: the batch where its pages split evenly, else one."""
    b = case.batch_size
    return b if b > 0 and pages % b == 0 else 1


def _dequant(case: Case, x: dict, module, model: str, gather: str) -> Prepared:
    src = x["k_cache"]
    pages, page_size = src.shape[:2]
    k_cache = src.view(torch.uint8)[:, :, 0]  # [num_blocks, block_size, record bytes]
    requests = requests_of(case, pages)
    per_request = pages // requests
    tokens = per_request * page_size
    device = src.device
    out = guard.Guarded.empty((requests, tokens, D_QK), torch.bfloat16, device, "its workspace")
    table = torch.arange(pages, dtype=torch.int32, device=device).view(requests, per_request)
    seq_lens = torch.full((requests,), tokens, dtype=torch.int32, device=device)

    def call():
        module.dequantize_and_gather_k_cache(
            out.tensor, k_cache, seq_lens, None, table, page_size, 0
        )

    run = on_device(call, device)

    def finish(_) -> Output:
        out.check()
        return Output(out.tensor.reshape(-1, D_QK).clone())

    poison = lambda: out.tensor.fill_(float("nan"))  # noqa: E731
    name = f"vllm deepseek_{model} dequantize_and_gather_k_cache"
    info = {"kernel": name, "requests": requests, "record_bytes": RECORD_BYTES[case.layout]}
    if model == "v41" and case.layout == "v4":
        info["gather"] = gather
    run()
    return Prepared(run, finish, poison, info, buffers=(k_cache, table, seq_lens))
