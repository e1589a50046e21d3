"""vLLM's Triton index remap (vllm/v1/attention/backends/mla/sparse_utils.py), loaded out of a
`vllm-triton-<v>` build folder without importing vLLM (toolchains/pyfiles.py loads it).

The file runs unchanged (its sha256 is in build.json). What it imports from vLLM is answered
while it loads, by stubs (shims() below); a later release importing more fails to load with the
missing name in the reason. The stubs that matter at run time:
  vllm.triton_utils             tl, triton: the installed Triton
  vllm.model_executor.warmup.jit_warmup.kernel_launcher and
  ...jit_warmup_triton_helper.VllmTritonJitKernel.launch: vLLM's launch path without its
      warmup (jit_warmup.py and jit_warmup_triton_helper.py, vLLM 0.33.0): the `__call__`'s
      arguments bound to the kernel's parameters by name (`x`, `x_ptr`, `X`, `X_PTR`, never
      over a launch keyword), `*_stride<d>` parameters from the bound tensor's stride, then
      `kernel[grid](**kwargs)`
Everything else (VllmConfig, the DCP group, the warmup keys) is only read by vLLM's warmup and
answers with an error if called.
"""

from __future__ import annotations

import inspect
import types
from functools import wraps
from pathlib import Path
from typing import Any, Generic, TypeVar

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.toolchains import pyfiles

PREFIX = "dsv4bench_vllm_triton"
SPARSE_UTILS = "mla/sparse_utils.py"  # relative to the build's folder
FILES = (SPARSE_UTILS,)

K = TypeVar("K")


def _warmup_only(name: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{name} is vLLM's warmup machinery, not loaded by dsv4bench")

    return refuse


def _binding(arg_names: tuple[str, ...], inputs: dict, launch: dict) -> dict:
    """jit_warmup_triton_helper._launch_binding_plan applied: inputs onto kernel parameters,
    then the `<name>_stride<d>` parameters from the bound tensors."""
    kwargs = dict(launch)
    for name, value in inputs.items():
        for target in (name, f"{name}_ptr", name.upper(), f"{name}_ptr".upper()):
            if target in arg_names:
                if target not in launch:
                    kwargs[target] = value
                break
    for target in arg_names:
        if target in kwargs:
            continue
        for sep, pointer in (("_stride", "{}_ptr"), ("_STRIDE", "{}_PTR")):
            name, found, dim = target.rpartition(sep)
            dim = dim.removeprefix("_")
            if found and (not dim or dim.isdigit()):
                source = name if name in kwargs else pointer.format(name)
                if source in kwargs:
                    kwargs[target] = kwargs[source].stride(int(dim or 0))
                break
    return kwargs


class VllmTritonJitKernel(Generic[K]):
    """The runtime half of vLLM's VllmTritonJitKernel: launch, no warmup."""

    kernel: Any
    bind_launch_inputs = True

    def launch(self, launch_spec, inputs: dict):
        grid, launch_kwargs = launch_spec[:2]
        outputs = launch_spec[2] if len(launch_spec) == 3 else None
        arg_names = tuple(self.kernel.arg_names)
        kwargs = _binding(arg_names, inputs, dict(launch_kwargs))
        kernel = kwargs.pop("kernel", None) or self.kernel
        if grid is not None:
            kernel[grid](**kwargs)
        return outputs


def kernel_launcher(call_fn):
    """jit_warmup.kernel_launcher: the call's arguments, bound by name, then launch()."""
    signature = inspect.signature(call_fn)

    @wraps(call_fn)
    def wrapper(self, *args, **kwargs):
        spec = call_fn(self, *args, **kwargs)
        if not self.bind_launch_inputs:
            return self.launch(spec, {})
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return self.launch(spec, {k: v for k, v in bound.arguments.items() if k != "self"})

    return wrapper


def shims() -> pyfiles.Shims:
    """The stubs, {module name: {attribute: value}} (Triton imported only when one loads)."""
    import triton
    import triton.language as tl

    return {
        "vllm.config": {"VllmConfig": type("VllmConfig", (), {})},
        "vllm.distributed": {"get_dcp_group": _warmup_only("get_dcp_group")},
        "vllm.model_executor.warmup.jit_warmup": {
            "kernel_launcher": kernel_launcher,
            "zip_inputs": _warmup_only("zip_inputs"),
        },
        "vllm.model_executor.warmup.jit_warmup_triton_helper": {
            "LaunchSpec": tuple,
            "TritonWarmupTensor": type("TritonWarmupTensor", (), {}),
            "VllmTritonJitKernel": VllmTritonJitKernel,
            "triton_scalar_specialization_rep": _warmup_only("triton_scalar_specialization_rep"),
        },
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.utils.math_utils": {"cdiv": lambda a, b: -(-a // b)},
        "vllm.v1.kv_cache_interface": {"AttentionSpec": type("AttentionSpec", (), {})},
        "vllm.v1.worker.block_table": {
            "get_block_table_width": _warmup_only("get_block_table_width")
        },
    }


_LOADED: dict[str, types.ModuleType] = {}


def missing_files(folder: Path) -> list[str]:
    return [f for f in FILES if not (folder / f).is_file()]


def sparse_utils(folder: Path) -> types.ModuleType:
    """The build's sparse_utils.py, loaded once per folder (kept in sys.modules under PREFIX:
    Triton's JIT finds a kernel's source through its module)."""
    key = str(folder.resolve())
    if key in _LOADED:
        return _LOADED[key]
    path = folder / SPARSE_UTILS
    if not path.is_file():
        raise Unsupported(f"vLLM Triton build {folder} lacks {SPARSE_UTILS}")
    name = f"{PREFIX}_{abs(hash(key)):x}_sparse_utils"
    module = pyfiles.load_file(name, path, shims(), engine="vllm", label="vLLM")
    _LOADED[key] = module
    return module
