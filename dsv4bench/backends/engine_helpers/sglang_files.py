"""sglang's helper kernel files, loaded out of a `sglang-ops-<v>` build folder without importing
sglang (toolchains/pyfiles.py loads them). What they import of sglang while they load is
answered by the build's own dsv4/kv_layout.py (`sglang.kernels.ops.attention.dsv4.kv_layout`)
and by stubs (SHIMS) holding the value each name has on an NVIDIA GPU:
  sglang.srt.utils                              is_hip() False, is_gfx95_supported() False
  sglang.kernels.ops.quantization.fp8_kernel    is_fp8_fnuz() False
  sglang.srt.environ                            envs.SGLANG_SM120_FLASHMLA_BACKEND.get() =
      "torch" (read once at import by flash_mla_sm120.py; its page split kernel is called
      directly, so the dispatcher it picks is never run here)
  sglang.kernels.jit.utils                      is_hip_runtime() False; get_jit_cuda_arch():
      the device's (major, minor) as sglang's own body reads it (torch.cuda), and on a machine
      without CUDA (Triton's interpreter) (10, 0), so that the V4.1 path its SM100 check
      guards runs there too
A later release that imports more of sglang fails to load with the missing name in the reason.
"""

from __future__ import annotations

import types
from pathlib import Path

from dsv4bench.backends.toolchains import pyfiles
from dsv4bench.kernels.catalog import SGLANG_OPS

PREFIX = "dsv4bench_sglang_ops"  # the loaded files' module names start with it
SGLANG_ATTENTION = "sglang.kernels.ops.attention"
FILES = SGLANG_OPS
INTERPRETER_ARCH = (10, 0)
SM120_BACKEND = "torch"  # what the environ stub answers for SGLANG_SM120_FLASHMLA_BACKEND


def _arch():
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
    else:
        major, minor = INTERPRETER_ARCH
    return types.SimpleNamespace(major=major, minor=minor, suffix="")


class _EnvVar:
    def __init__(self, value):
        self._value = value

    def get(self):
        return self._value


SHIMS: pyfiles.Shims = {
    "sglang.srt.utils": {"is_hip": lambda: False, "is_gfx95_supported": lambda: False},
    "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
    "sglang.srt.environ": {
        "envs": types.SimpleNamespace(SGLANG_SM120_FLASHMLA_BACKEND=_EnvVar(SM120_BACKEND))
    },
    "sglang.kernels.jit.utils": {"is_hip_runtime": lambda: False, "get_jit_cuda_arch": _arch},
}


class Files:
    """The build's files, each loaded once (under PREFIX names kept in sys.modules: Triton's
    JIT looks a kernel's source up through its module)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.tag = f"{PREFIX}_{abs(hash(str(folder.resolve()))):x}"
        self._modules: dict[str, types.ModuleType] = {}

    def module(self, rel: str) -> types.ModuleType:
        if rel in self._modules:
            return self._modules[rel]
        real: dict[str, types.ModuleType] = {}
        if rel == "dsv4/dequant_k_cache.py":
            real[f"{SGLANG_ATTENTION}.dsv4.kv_layout"] = self.module("dsv4/kv_layout.py")
        name = f"{self.tag}.{rel.removesuffix('.py').replace('/', '.')}"
        pyfiles.ensure_parents(name)
        module = pyfiles.load_file(name, self.folder / rel, SHIMS, real)
        self._modules[rel] = module
        return module


_FILES: dict[str, Files] = {}


def files(folder: Path) -> Files:
    return _FILES.setdefault(str(folder.resolve()), Files(folder))
