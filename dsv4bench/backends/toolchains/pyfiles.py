"""An engine's Python kernel files loaded out of a build folder, the engine's own imports
answered by stubs: the files run unchanged (their sha256 is in the build's build.json), and
only while one loads does sys.modules hold the stubs the family passes in.

A family declares its stubs as SHIMS, {module name: {attribute: value}} (each with the value it
has on an NVIDIA GPU), and, where the build holds the engine's own module, hands that in as a
real module. A later release that imports more of the engine fails to load with the missing
name in the reason instead of running edited code.

Public names (each documented below):
  load_file       one file as a module of the given name, stubs in place while it runs
  stub_modules    SHIMS (and real modules) as modules, their parents as empty packages
  ensure_parents  empty packages for the dotted parents of a module name
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

from dsv4bench.backends.base import REASON_CHARS, Unsupported

Shims = dict[str, dict]  # module name -> {attribute: value}


def stub_modules(
    shims: Shims, real: dict[str, types.ModuleType] | None = None
) -> dict[str, types.ModuleType]:
    """Modules holding `shims`' attributes (their parents as empty packages), plus `real`
    modules under the names given (set on their parent too)."""
    real = real or {}
    stubs: dict[str, types.ModuleType] = {}
    for name in [*shims, *real]:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            module = stubs.setdefault(sub, types.ModuleType(sub))
            if not hasattr(module, "__path__"):
                module.__path__ = []
    for name, values in shims.items():
        for attr, value in values.items():
            setattr(stubs[name], attr, value)
    for name, module in real.items():
        stubs[name] = module
        parent, _, leaf = name.rpartition(".")
        setattr(stubs[parent], leaf, module)
    return stubs


def ensure_parents(name: str) -> None:
    """Empty packages in sys.modules for every dotted parent of `name` not there yet."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            pkg = types.ModuleType(sub)
            pkg.__path__ = []
            sys.modules[sub] = pkg


def load_file(
    name: str,
    path: Path,
    shims: Shims,
    real: dict[str, types.ModuleType] | None = None,
    package_dir: Path | None = None,
    engine: str = "sglang",
    label: str = "",
) -> types.ModuleType:
    """The file `path` as module `name`, kept in sys.modules (Triton's and TileLang's JITs look
    a kernel's source up through its module); `engine`'s imports answered by stub_modules(
    shims, real), which are gone again once it is loaded. package_dir: load it as a package
    (an __init__.py) whose modules are found there. label: the engine as reasons name it
    ("vLLM"; default `engine`). Unsupported, one line, if it fails."""
    label = label or engine
    stubs = stub_modules(shims, real)
    saved = {n: sys.modules.get(n) for n in stubs}
    locations = [str(package_dir)] if package_dir is not None else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise Unsupported(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules.update(stubs)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        what = f"{type(e).__name__}: {e}"
        if isinstance(e, ImportError) and (e.name or "").startswith(engine):
            what += f" (the file imports more of {label} than this backend stubs)"
        raise Unsupported(f"cannot load {label}'s {path.name}: {what}"[:REASON_CHARS]) from e
    finally:
        for n, old in saved.items():
            if old is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = old
    return module
