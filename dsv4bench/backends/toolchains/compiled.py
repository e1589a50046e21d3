"""Sources and compiler found once, each module built and loaded once, a failure remembered:
what a family whose kernels are compiled on first use (nvcc.py) holds per instance.

A family declares its sources (how they are found: library.build_folder), how one module is
built from them (a spec: its wrapper, flags, files) and how a built module is loaded; a
Toolchain calls them. Finding is cheap and happens without building (`reason()`: what
`backends`, `plan` and the rows say when a piece is missing); a module is built on the first
case that needs it, on that case's device.

    chain = Toolchain("Q8KV8", find_sources, describe, build, load)
    chain.reason()               # None, or the one-line reason a piece is missing
    chain.module(device, spec)   # built (or found in the cache) and loaded once
    chain.info(spec)             # what the row records about its build (module, nvcc, built_s)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.toolchains.library import LazyOps
from dsv4bench.backends.toolchains.nvcc import CompileError, find_nvcc

ONE = "module"  # the key of a family's only module (a spec of None)


class Toolchain:
    """find_sources() -> the family's sources (Unsupported naming what is missing);
    describe(sources) -> the Provider rows record; build(sources, nvcc, capability, spec) ->
    (module file, build info); load(sources, module file) -> the loaded module. `what` names
    the kernel in the reasons (nvcc missing)."""

    def __init__(
        self,
        what: str,
        find_sources: Callable[[], Any],
        describe: Callable[[Any], Provider],
        build: Callable[[Any, str, tuple[int, int], Any], tuple[Path, dict]],
        load: Callable[[Any, Path], Any],
    ):
        self.what = what
        self._describe, self._build, self._load = describe, build, load
        self._found = LazyOps(None, lambda: (find_sources(), find_nvcc(what)))
        self._modules: dict[str, Any] = {}
        self._errors: dict[str, Exception] = {}
        self._info: dict[str, dict] = {}

    def provider(self) -> Provider:
        """The sources' Provider; Unsupported if the sources or nvcc are missing."""
        return self._describe(self._found.get()[0])

    def reason(self) -> str | None:
        """A missing piece (sources, headers, tvm-ffi, nvcc), found without building."""
        try:
            self.provider()
        except Unsupported as e:
            return str(e)
        return None

    def info(self, spec=None) -> dict:
        """What the row records about the build of `spec`'s module ({} before it is built)."""
        return self._info.get(_key(spec), {})

    def module(self, device, spec=None):
        """The module of `spec` (a family's description of one module, with a `name`; None:
        the family's only one), built for the device's capability and loaded once; a failed
        build is raised again, unchanged, for every later case."""
        import torch

        key = _key(spec)
        if key in self._errors:
            raise self._errors[key]
        if key not in self._modules:
            src, nvcc = self._found.get()
            try:
                capability = tuple(torch.cuda.get_device_capability(device))
                path, self._info[key] = self._build(src, nvcc, capability, spec)
            except (CompileError, Unsupported) as e:
                self._errors[key] = e
                raise
            self._modules[key] = self._load(src, path)
        return self._modules[key]


def _key(spec) -> str:
    return ONE if spec is None else spec.name
