"""What the engine helper backends share: where a build folder is (option `lib`, the backend's
environment variable, the kernels folder's newest build of the library: toolchains/library.py's
build_folder) and why it cannot load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4bench.backends.toolchains import library


@dataclass(frozen=True)
class BuildPlace:
    label: str  # "vLLM's Triton remap"
    glob: str  # "vllm-triton-*/" (the kernels folder's builds of the library)
    fetch: str  # the command that brings one
    files: tuple[str, ...]  # what the folder must hold
    backend: str  # the backend's name (its `lib` option)

    @property
    def env(self) -> str:
        """The environment variable naming a folder: DSV4BENCH_VLLM_TRITON_LIB."""
        return library.lib_env(self.backend)

    def not_found(self) -> str:
        also = f"or pass --backend-opt {self.backend}.lib=FOLDER ({self.env})"
        return f"{self.label} not found: {self.fetch}, {also}"

    def folder(self, lib: str | None) -> Path | None:
        return library.build_folder(lib, self.env, self.glob, lambda folder: folder, lambda: None)

    def missing_reason(self, lib: str | None) -> str | None:
        """Why the build cannot load, known without loading it; None if its files are there."""
        folder = self.folder(lib)
        if folder is None:
            return self.not_found()
        if not folder.is_dir():
            return f"{self.label} build not found: no folder {folder} ({self.fetch})"
        gone = [f for f in self.files if not (folder / f).is_file()]
        if gone:
            return f"{self.label} build {folder} lacks {', '.join(gone)} ({self.fetch})"
        return None


def version_of(folder: Path) -> str:
    """`vllm 0.33.0` from a fetched build's build.json; else the folder's name."""
    import json

    try:
        build = json.loads((folder / "build.json").read_text())
        return f"{build['package']} {build['version']}"
    except (OSError, ValueError, KeyError):
        return f"folder {folder.name}"


class HelperBackend(library.LibraryBackend):
    """What the engine helper backends share: the provider their loader found, the build's
    reason (known without loading it), and supports() = the declarations, the case, the build."""

    place: BuildPlace

    def provider(self):
        return self.kernel_ops()[0]

    def build_reason(self) -> str | None:
        return None if self._found.loaded else self.place.missing_reason(self.lib)

    def supports(self, case, arch: str) -> str | None:
        return super().supports(case, arch) or self.case_reason(case, arch) or self.build_reason()

    def case_reason(self, case, arch: str = "cpu") -> str | None:
        return None
