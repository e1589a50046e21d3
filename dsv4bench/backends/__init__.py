"""Backend registry: shipped backends, `--plugin MODULE`s and the `dsv4bench.backends` entry points.

A plugin module registers its backends by calling `register(...)` when imported, or by
defining `BACKENDS` (a list of Backend objects). An entry point names a Backend subclass, a
Backend object, or a zero-argument factory returning one or a list of them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib import metadata
from pathlib import Path

from dsv4bench.backends.base import Backend, Output, Prepared, Provider, Unsupported

__all__ = ["Backend", "Output", "Prepared", "Provider", "Unsupported", "register", "get", "names"]

ENTRY_POINT_GROUP = "dsv4bench.backends"
_REGISTRY: dict[str, Backend] = {}
_loaded_builtin = False


class PluginError(Exception):
    """A plugin could not be loaded; the message is one line for the user."""


def register(backend: Backend, *, replace: bool = False) -> Backend:
    if not backend.name:
        raise PluginError(f"{type(backend).__name__}: a backend needs a name")
    if backend.name in _REGISTRY and not replace and _REGISTRY[backend.name] is not backend:
        raise PluginError(f"backend {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def _load_builtin() -> None:
    global _loaded_builtin
    if _loaded_builtin:
        return
    _loaded_builtin = True
    from dsv4bench.backends import (
        deepgemm,
        flashinfer,
        flashmla,
        reference_f64,
        torch_ref,
        triton_kernels,
    )

    register(torch_ref.TorchReference())
    register(flashmla.FlashMLA())
    register(flashinfer.FlashInfer())
    # FlashInfer with an FP8 (e4m3) KV variant, until `--backend-opt flashinfer.kv_dtype=e4m3`
    # instances exist: scenarios compare both variants side by side
    e4m3 = flashinfer.FlashInfer(kv_dtype="e4m3")
    e4m3.name = "flashinfer-e4m3"
    register(e4m3)
    register(triton_kernels.TritonKernels())
    register(deepgemm.DeepGEMM())
    register(reference_f64.ReferenceF64())


def _as_backends(obj, origin: str) -> list[Backend]:
    if (isinstance(obj, type) and issubclass(obj, Backend)) or (
        callable(obj) and not isinstance(obj, Backend)
    ):
        obj = obj()
    items = obj if isinstance(obj, (list, tuple)) else [obj]
    for item in items:
        if not isinstance(item, Backend):
            raise PluginError(f"{origin}: expected a dsv4bench Backend, got {type(item).__name__}")
    return list(items)


def load_plugin(module: str) -> list[str]:
    """Import MODULE (a dotted name or a .py path); returns the names it registered."""
    before = set(_REGISTRY)
    try:
        if module.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(module).stem, module)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {module}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            # a console script's sys.path lacks the current directory that `python -m` has:
            # `--plugin tests.plugins.x` from a checkout must work from either
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())
            mod = importlib.import_module(module)
    except Exception as e:  # a broken plugin is the user's input: report it in one line
        raise PluginError(f"--plugin {module}: cannot import: {type(e).__name__}: {e}") from e
    for b in _as_backends(getattr(mod, "BACKENDS", []), f"--plugin {module}"):
        register(b, replace=True)
    return sorted(set(_REGISTRY) - before)


def load_entry_points() -> list[str]:
    before = set(_REGISTRY)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:
            raise PluginError(f"entry point {ep.name} ({ep.value}): {type(e).__name__}: {e}") from e
        for b in _as_backends(obj, f"entry point {ep.name}"):
            register(b, replace=True)
    return sorted(set(_REGISTRY) - before)


def setup(plugins: list[str] = (), flashmla_lib: str | None = None) -> None:
    """Load shipped backends, entry points and plugins; configure library paths."""
    _load_builtin()
    if flashmla_lib:
        _REGISTRY["flashmla"].lib_path = flashmla_lib
    load_entry_points()
    for module in plugins:
        load_plugin(module)


def get(name: str) -> Backend:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r} (known: {', '.join(names())})") from None


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)
