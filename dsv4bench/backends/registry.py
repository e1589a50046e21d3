"""The registry's machinery: shipped backends (backends/__init__.py's table), `--plugin
MODULE`s and the `dsv4bench.backends` entry points, and instances built with other options.

A plugin module registers its backends by calling `register(...)` when imported, or by
defining `BACKENDS` (a list of Backend objects). An entry point names a Backend subclass, a
Backend object, or a zero-argument factory returning one or a list of them.

Instances: `configure(base, options, name)` builds a backend with other options (see
Backend.options) and registers it under `name` (default: replaces `base` itself), so two
FlashMLA builds or FlashInfer bf16 and e4m3 run side by side. Workers repeat the same calls
from `configured()`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from dsv4bench.backends.base import Backend

ENTRY_POINT_GROUP = "dsv4bench.backends"
_REGISTRY: dict[str, Backend] = {}
_CONFIGURED: dict[str, dict] = {}  # instance name -> {"name", "base", "options"}, in order
_loaded_builtin = False
_shipped: Callable[[], dict[str, Callable[[], Backend]]] = dict


def ship(table: Callable[[], dict[str, Callable[[], Backend]]]) -> None:
    """Set the shipped backends' table (backends/__init__.py's shipped()), read on first use."""
    global _shipped
    _shipped = table


class PluginError(Exception):
    """A plugin could not be loaded; the message is one line for the user."""


class OptionError(PluginError):
    """A backend option that does not exist or does not fit; the message is one line."""


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
    for name, make in _shipped().items():
        backend = make()
        backend.name = name
        register(backend)


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
            if set(_REGISTRY) == before and module in sys.modules:
                # imported before: its import-time register() calls ran then, and the
                # registry may have been reset since; running it again registers them anew
                mod = importlib.reload(mod)
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


def setup(plugins: list[str] = (), instances: list[dict] = ()) -> None:
    """Load shipped backends, entry points and plugins; then build `instances` (configured())."""
    _load_builtin()
    load_entry_points()
    for module in plugins:
        load_plugin(module)
    configure_all(instances)


def _coerce(value: Any, default: Any, where: str) -> Any:
    """An option value as the type of its default (a command line gives text)."""
    kind = type(default)
    if default is None or isinstance(value, kind) or (kind is float and type(value) is int):
        return value
    if isinstance(value, str):
        with contextlib.suppress(KeyError, ValueError):
            if kind is bool:
                return {"true": True, "1": True, "false": False, "0": False}[value.lower()]
            return kind(value)
    raise OptionError(f"{where}: expected {kind.__name__}, got {value!r}")


def configure(base: str, options: dict, name: str | None = None, origin: str = "") -> Backend:
    """Register `base` built with `options` under `name` (default: `base` itself, replaced).

    Options not given keep the value `base`'s registered instance has, so an instance
    defined in a scenario inherits `--backend-opt` settings. `origin` prefixes errors."""
    where = f"{origin}: " if origin else ""
    try:
        proto = get(base)
    except KeyError as e:
        raise OptionError(f"{where}{e.args[0]}") from None
    declared = type(proto).options
    values = proto.option_values()
    for key, value in options.items():
        if key not in declared:
            has = ", ".join(declared) or "none"
            raise OptionError(f"{where}{base}: unknown option {key!r} (options: {has})")
        values[key] = _coerce(value, declared[key], f"{where}{base}.{key}")
    name = name or base
    try:
        backend = type(proto)(**values)
    except (TypeError, ValueError) as e:
        raise OptionError(f"{where}{base}: {e}") from None
    backend.name = name
    old = _CONFIGURED.get(name)
    if name != base and old is not None and (old["base"], old["options"]) != (base, values):
        raise OptionError(f"{where}backend {name!r} is already defined with other options")
    existing = _REGISTRY.get(name) if name != base and old is None else None
    # a registered backend of that name is fine only if it is this very instance
    if existing is not None and not (
        type(existing) is type(backend) and existing.option_values() == values
    ):
        raise OptionError(f"{where}backend {name!r} already exists; choose another `as` name")
    _REGISTRY[name] = backend
    _CONFIGURED[name] = {"name": name, "base": base, "options": values}
    return backend


def parse_option(text: str) -> tuple[str, str, str]:
    """`NAME.OPTION=VALUE` (a --backend-opt) -> (name, option, value)."""
    head, eq, value = text.partition("=")
    name, dot, key = head.partition(".")
    if not (eq and dot and name and key):
        raise OptionError(f"--backend-opt {text}: expected BACKEND.OPTION=VALUE")
    return name, key, value


def apply_options(texts: list[str]) -> None:
    """`--backend-opt NAME.OPTION=VALUE`s: each named backend rebuilt once with all of its."""
    per_backend: dict[str, dict] = {}
    for text in texts:
        name, key, value = parse_option(text)
        per_backend.setdefault(name, {})[key] = value
    for name, values in per_backend.items():
        configure(name, values, origin="--backend-opt")


def configure_all(instances: list[dict]) -> None:
    """A scenario's instance entries ({"name", "base", "options", "origin"})."""
    for inst in instances:
        configure(inst["base"], inst["options"], inst["name"], inst.get("origin", ""))


def configured() -> list[dict]:
    """The instances built so far, for a worker to build the same ones."""
    return list(_CONFIGURED.values())


def catalog() -> dict[str, dict[str, Any]]:
    """Every registered name -> its declared options (what a scenario may set)."""
    _load_builtin()
    return {n: dict(type(b).options) for n, b in sorted(_REGISTRY.items())}


def get(name: str) -> Backend:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r} (known: {', '.join(names())})") from None


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)
