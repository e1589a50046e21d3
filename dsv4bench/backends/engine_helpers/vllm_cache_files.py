"""vLLM's DeepSeek V4 and V4.1 Triton cache ops (vllm/models/deepseek_v4/common/ops/cache_utils.py
and .../deepseek_v41/common/ops/cache_utils.py, vLLM 0.33.0), loaded out of a `vllm-triton-<v>`
build folder without importing vLLM (toolchains/pyfiles.py loads them, unchanged).

Their vLLM imports are answered by vllm_files.py's stubs (the launch path of vLLM's
VllmTritonJitKernel without its warmup) plus the ones below. The stubs that matter at run time:
  vllm.platforms.current_platform   is_fp8_fnuz() False (an NVIDIA GPU: OCP e4m3); is_rocm()
      as asked (False: the CUDA kernels; True: the V4.1 file's one-pass V4 gather, ROCm's pick)
  vllm.utils.import_utils.has_cutedsl   False: the Triton gather. vLLM takes its CuteDSL gather
      (nvidia/ops/dequant_gather_k_cutedsl.py, not in this build) where cutlass-dsl is installed
  vllm.utils.math_utils             cdiv, next_power_of_2
The rest (zip_inputs, WarmupIntRange, get_compress_ratios, the warmup tensors) is read only by
vLLM's warmup: zip_inputs, called while the V4.1 file loads, returns its rows untouched; the
others refuse if called. get_fp8_min_max is the FNUZ path's alone and refuses too.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Generic, TypeVar

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.engine_helpers import vllm_files
from dsv4bench.backends.toolchains import pyfiles

PREFIX = "dsv4bench_vllm_cache"
# the files, relative to the build's folder (outside the build's strip: their wheel paths)
FILES = {
    "v4": "vllm/models/deepseek_v4/common/ops/cache_utils.py",
    "v41": "vllm/models/deepseek_v41/common/ops/cache_utils.py",
}

K = TypeVar("K")


class _Platform:
    """vllm.platforms.current_platform as an NVIDIA GPU answers (is_rocm as asked)."""

    def __init__(self, rocm: bool):
        self.rocm = rocm

    def is_fp8_fnuz(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return self.rocm

    def is_cuda(self) -> bool:
        return not self.rocm


class VllmJitKernel(Generic[K]):
    """vLLM's warmup-registered kernel base; the V4.1 file's subclasses launch by themselves."""


def _zip_inputs(*rows):
    return rows  # warmup rows, never read here


def _next_power_of_2(n: int) -> int:
    return 1 if n < 1 else 1 << (int(n) - 1).bit_length()


def _merged(base: pyfiles.Shims, more: pyfiles.Shims) -> pyfiles.Shims:
    out = {name: dict(values) for name, values in base.items()}
    for name, values in more.items():
        out.setdefault(name, {}).update(values)
    return out


def shims(rocm: bool = False) -> pyfiles.Shims:
    """vllm_files.shims() and the names these two files import beyond them."""
    refuse = vllm_files._warmup_only
    jit = "vllm.model_executor.warmup.jit_warmup"
    return _merged(
        vllm_files.shims(),
        {
            "vllm.model_executor.layers.quantization.utils.quant_utils": {
                "get_fp8_min_max": refuse("get_fp8_min_max (FNUZ only)")
            },
            jit: {
                "WarmupIntRange": refuse("WarmupIntRange"),
                "zip_inputs": _zip_inputs,
                "VllmJitKernel": VllmJitKernel,
                "_WarmupInputRows": tuple,
            },
            f"{jit}_triton_helper": {
                "TritonPointerInputVariant": type("TritonPointerInputVariant", (), {}),
            },
            "vllm.platforms": {"current_platform": _Platform(rocm)},
            "vllm.transformers_utils.deepseek_v4_utils": {
                "get_compress_ratios": refuse("get_compress_ratios")
            },
            "vllm.utils.import_utils": {"has_cutedsl": lambda: False},
            "vllm.utils.math_utils": {
                "cdiv": lambda a, b: -(-a // b),
                "next_power_of_2": _next_power_of_2,
            },
        },
    )


_LOADED: dict[tuple[str, str, bool], types.ModuleType] = {}


def missing_files(folder: Path) -> list[str]:
    return [f for f in FILES.values() if not (folder / f).is_file()]


def cache_utils(folder: Path, model: str, rocm: bool = False) -> types.ModuleType:
    """The build's cache_utils.py of `model` ("v4" or "v41"), loaded once per folder and
    platform (kept in sys.modules: Triton's JIT finds a kernel's source through its module)."""
    key = (str(folder.resolve()), model, rocm)
    if key in _LOADED:
        return _LOADED[key]
    path = folder / FILES[model]
    if not path.is_file():
        raise Unsupported(f"vLLM Triton build {folder} lacks {FILES[model]}")
    platform = "rocm" if rocm else "cuda"
    name = f"{PREFIX}_{abs(hash(key[0])):x}_{model}_{platform}"
    module = pyfiles.load_file(name, path, shims(rocm), engine="vllm", label="vLLM")
    _LOADED[key] = module
    return module
