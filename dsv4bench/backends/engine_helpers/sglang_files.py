"""sglang's helper kernel files, loaded out of a `sglang-ops-<v>` build folder without importing
sglang, by the sglang-triton backend's loader (backends/sglang_triton/sources.py: its stubs
SHIMS answer `is_hip`, `is_fp8_fnuz`, `is_gfx95_supported`, the sm120 environ). Beyond those,
dsv4/dequant_k_cache.py imports:
  sglang.kernels.ops.attention.dsv4.kv_layout   the build's own kv_layout.py
  sglang.kernels.jit.utils                      is_hip_runtime() False; get_jit_cuda_arch():
      the device's (major, minor) as sglang's own body reads it (torch.cuda), and on a machine
      without CUDA (Triton's interpreter) (10, 0), so that the V4.1 path its SM100 check
      guards runs there too
"""

from __future__ import annotations

import types
from pathlib import Path

from dsv4bench.backends.sglang_triton.sources import SGLANG_ATTENTION, Loader
from dsv4bench.kernels.catalog import SGLANG_OPS

FILES = SGLANG_OPS
INTERPRETER_ARCH = (10, 0)


def _arch():
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
    else:
        major, minor = INTERPRETER_ARCH
    return types.SimpleNamespace(major=major, minor=minor, suffix="")


def _jit_utils() -> types.ModuleType:
    module = types.ModuleType("sglang.kernels.jit.utils")
    module.is_hip_runtime = lambda: False
    module.get_jit_cuda_arch = _arch
    return module


class Files:
    """The build's files, each loaded once (under the loader's PREFIX names)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.loader = Loader(folder)
        self._modules: dict[str, types.ModuleType] = {}

    def module(self, rel: str) -> types.ModuleType:
        if rel in self._modules:
            return self._modules[rel]
        extra: dict[str, types.ModuleType] = {}
        if rel == "dsv4/dequant_k_cache.py":
            extra[f"{SGLANG_ATTENTION}.dsv4.kv_layout"] = self.module("dsv4/kv_layout.py")
            extra["sglang.kernels.jit.utils"] = _jit_utils()
        name = f"{self.loader.tag}.ops.{rel.removesuffix('.py').replace('/', '.')}"
        self.loader._ensure_parents(name)
        module = self.loader._exec(name, self.folder / rel, extra)
        self._modules[rel] = module
        return module


_FILES: dict[str, Files] = {}


def files(folder: Path) -> Files:
    return _FILES.setdefault(str(folder.resolve()), Files(folder))
