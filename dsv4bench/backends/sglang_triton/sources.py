"""sglang's Triton sparse MLA files, loaded out of a `sglang-triton-<v>` build folder (`dsv4bench
kernels fetch sglang`: the files of sglang/kernels/ops/attention/ under their own relative paths)
without importing sglang (toolchains/pyfiles.py loads them).

The files run unchanged (their sha256 is in the build's build.json). What they import from
sglang is answered while each loads, and only then:
  - by sglang's own file where the build holds it: `sglang.kernels.ops.attention.metadata`
    (torch and Triton only) and, for the dsv4 package's __init__, its sibling module;
  - by stubs holding the names below with the value each has on an NVIDIA GPU (SHIMS):
      sglang.srt.utils            is_hip() False, is_gfx95_supported() False,
                                  get_device_core_count(i) = the device's SM count (sglang's
                                  own body for CUDA)
      sglang.srt.utils.common     is_gfx942_supported() False
      sglang.kernels.ops.quantization.fp8_kernel   is_fp8_fnuz() False
      sglang.srt.environ          envs.SGLANG_SM120_FLASHMLA_BACKEND.get() = "torch" (read
                                  once at import by flash_mla_sm120.py: its dispatcher then
                                  runs the PyTorch fallback, as SGLANG_SM120_FLASHMLA_BACKEND=
                                  torch makes it; its Triton kernel is called directly)
A later release that imports more from sglang fails to load with the missing name in the reason
instead of running edited code.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.toolchains import pyfiles
from dsv4bench.kernels.catalog import SGLANG_TRITON, SGLANG_TRITON_DSV4

PREFIX = "dsv4bench_sglang_triton"  # the loaded files' module names start with it
SGLANG_ATTENTION = "sglang.kernels.ops.attention"
DSV4_PACKAGE = SGLANG_TRITON_DSV4
FILES = SGLANG_TRITON  # the build's files, relative to its folder (the catalog's BuildSpec)
SM120_BACKEND = "torch"  # what the environ stub answers for SGLANG_SM120_FLASHMLA_BACKEND


def _core_count(device_id: int = 0) -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return 0


class _EnvVar:
    def __init__(self, value):
        self._value = value

    def get(self):
        return self._value


SHIMS: dict[str, dict] = {
    "sglang.srt.utils": {
        "is_hip": lambda: False,
        "is_gfx95_supported": lambda: False,
        "get_device_core_count": _core_count,
    },
    "sglang.srt.utils.common": {"is_gfx942_supported": lambda: False},
    "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
    "sglang.srt.environ": {
        "envs": types.SimpleNamespace(SGLANG_SM120_FLASHMLA_BACKEND=_EnvVar(SM120_BACKEND))
    },
}


def missing_files(folder: Path) -> list[str]:
    return [f for f in FILES if not (folder / f).is_file()]


def version_of(folder: Path) -> str:
    """`sglang 0.5.23` from the build.json of a fetched build; else the folder's name."""
    try:
        build = json.loads((folder / "build.json").read_text())
        return f"{build['package']} {build['version']}"
    except (OSError, ValueError, KeyError):
        return f"folder {folder.name}"


class Loader:
    """Loads a build's files once each, under PREFIX names kept in sys.modules (Triton's JIT
    looks a kernel's source up through its module)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.tag = f"{PREFIX}_{abs(hash(str(folder.resolve()))):x}"
        self._modules: dict[str, types.ModuleType] = {}

    def _exec(self, name: str, path: Path, extra: dict, package_dir: Path | None = None):
        return pyfiles.load_file(name, path, SHIMS, extra, package_dir)

    def module(self, rel: str) -> types.ModuleType:
        """The loaded file `rel` (a FILES entry, or DSV4_PACKAGE for the package)."""
        if rel in self._modules:
            return self._modules[rel]
        if rel == DSV4_PACKAGE:
            module = self._dsv4_package()
        else:
            path = self.folder / rel
            if not path.is_file():
                raise Unsupported(f"sglang Triton build {self.folder} lacks {rel}")
            extra = {}
            if rel.startswith("dsa/"):
                extra[f"{SGLANG_ATTENTION}.metadata"] = self.module("metadata.py")
            if rel == "dsa/triton_sparse_mla_decode.py":
                extra[f"{SGLANG_ATTENTION}.dsa.triton_sparse_mla"] = self.module(
                    "dsa/triton_sparse_mla.py"
                )
            name = f"{self.tag}.{rel.removesuffix('.py').replace('/', '.')}"
            pyfiles.ensure_parents(name)
            module = self._exec(name, path, extra)
        self._modules[rel] = module
        return module

    def _dsv4_package(self) -> types.ModuleType:
        """dsv4/triton_sparse_decode as a package: its modules import each other relatively,
        and its __init__ imports its sibling by sglang's absolute name (answered by the
        sibling loaded here)."""
        folder = self.folder / DSV4_PACKAGE
        name = f"{self.tag}.dsv4_triton_sparse_decode"
        pyfiles.ensure_parents(name)
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg
        fused = self._exec(
            f"{name}.triton_mla_kernels_decode_fused",
            folder / "triton_mla_kernels_decode_fused.py",
            {},
        )
        optimized = self._exec(
            f"{name}.triton_mla_kernels_decode_optimized",
            folder / "triton_mla_kernels_decode_optimized.py",
            {},
        )
        sys.modules.pop(name, None)
        sibling = (
            f"{SGLANG_ATTENTION}.dsv4.triton_sparse_decode.triton_mla_kernels_decode_optimized"
        )
        module = self._exec(name, folder / "__init__.py", {sibling: optimized}, folder)
        module.triton_mla_kernels_decode_fused = fused
        module.triton_mla_kernels_decode_optimized = optimized
        return module
