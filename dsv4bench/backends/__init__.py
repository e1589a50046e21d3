"""Backends: kernel families behind one interface (base.Backend), by name.

The shipped ones are the table below, name -> factory (a class, or a call that builds one
with other options); a backend of a new kernel library is its module (its LibrarySpec for
library.py's discovery chain, its Backend subclass) and one line here. Plugins, entry points
and instances built with other options: registry.py.
"""

from __future__ import annotations

from collections.abc import Callable

from dsv4bench.backends import registry
from dsv4bench.backends.base import Backend, Prepared, Provider, Unsupported
from dsv4bench.backends.registry import (
    _CONFIGURED,
    _REGISTRY,
    ENTRY_POINT_GROUP,
    OptionError,
    PluginError,
    apply_options,
    catalog,
    configure,
    configure_all,
    configured,
    get,
    load_entry_points,
    load_plugin,
    names,
    parse_option,
    register,
    setup,
)
from dsv4bench.cases.output import Output

__all__ = [
    "_CONFIGURED",
    "_REGISTRY",
    "ENTRY_POINT_GROUP",
    "Backend",
    "OptionError",
    "Output",
    "PluginError",
    "Prepared",
    "Provider",
    "Unsupported",
    "apply_options",
    "catalog",
    "configure",
    "configure_all",
    "configured",
    "get",
    "load_entry_points",
    "load_plugin",
    "names",
    "parse_option",
    "pinnable_libraries",
    "register",
    "setup",
]


def shipped() -> dict[str, Callable[[], Backend]]:
    """Every shipped backend: name -> factory (imported on first use of the registry)."""
    from dsv4bench.backends import deepgemm, fa3, flashmla, torch_ref, torch_topk
    from dsv4bench.backends.builds import build_instances
    from dsv4bench.backends.engine_helpers.sglang_ops import SglangOps
    from dsv4bench.backends.engine_helpers.vllm_c import VllmOps
    from dsv4bench.backends.engine_helpers.vllm_triton import VllmTriton
    from dsv4bench.backends.engine_helpers.vllm_v4_cache import VllmV4Cache
    from dsv4bench.backends.f64.backend import ReferenceF64
    from dsv4bench.backends.flashinfer.backend import FlashInfer
    from dsv4bench.backends.q8kv8.backend import Q8KV8
    from dsv4bench.backends.sgl_topk.backend import SglangTopK
    from dsv4bench.backends.sglang_triton.backend import SglangTriton
    from dsv4bench.backends.tilelang.backend import TileLang
    from dsv4bench.backends.triton.backend import TritonKernels

    table: dict[str, Callable[[], Backend]] = {
        "torch": torch_ref.TorchReference,
        "torch-topk": torch_topk.TorchTopK,
        "flashmla": flashmla.FlashMLA,
        "flashinfer": FlashInfer,
        # FP8 (e4m3) KV under its own name, as shipped scenarios name it (the same instance
        # as {name: flashinfer, as: flashinfer-e4m3, kv_dtype: e4m3})
        "flashinfer-e4m3": lambda: FlashInfer(kv_dtype="e4m3"),
        "triton": TritonKernels,
        "fa3": fa3.FA3,
        "deepgemm": deepgemm.DeepGEMM,
        "tilelang": TileLang,
        "reference-f64": ReferenceF64,
        "q8kv8": Q8KV8,
        "sglang-topk": SglangTopK,
        "sglang-triton": SglangTriton,
        "vllm-triton": VllmTriton,
        "sglang-ops": SglangOps,
        "vllm-ops": VllmOps,
        "vllm-v4-cache": VllmV4Cache,
    }
    return {**table, **build_instances(table)}  # one instance per known build


def pinnable_libraries() -> set[str]:
    """The shipped backends with a `lib` option: each kernels-folder build of their library is
    a backend instance of its own (builds.py)."""
    from dsv4bench.backends.builds import pinnable

    return {name for name, make in shipped().items() if pinnable(make)}


registry.ship(shipped)
