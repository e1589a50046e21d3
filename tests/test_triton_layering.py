"""The Triton backend's module layering (issue 21): the host modules and their kernel sources
import each other as a tree (triton_kernels -> triton_attention, triton_indexer -> triton_jit ->
triton_src.*), the host modules import without Triton and never assign `tl`, and the kernel
sources name their byte offsets from reference.layout_table. Read from the source files: no
Triton needed."""

from __future__ import annotations

import ast
from pathlib import Path

from reference.layout_table import LAYOUTS

BACKENDS = Path(__file__).resolve().parent.parent / "dsv4bench" / "backends"
HOSTS = ("triton_kernels", "triton_attention", "triton_indexer", "triton_jit")
SOURCES = ("cache", "attention", "indexer", "layout", "__init__")
# which triton_* modules each may import (anywhere in the file, lazily included)
ALLOWED = {
    "triton_kernels": {"triton_attention", "triton_indexer", "triton_jit", "triton_src.layout"},
    "triton_attention": {"triton_jit", "triton_src.layout"},
    "triton_indexer": {"triton_jit"},
    "triton_jit": set(),
}


def _tree(name: str) -> ast.Module:
    path = BACKENDS / (f"{name}.py" if name in HOSTS else f"triton_src/{name}.py")
    return ast.parse(path.read_text())


def _triton_imports(tree: ast.Module) -> set[str]:
    """The dsv4bench.backends.triton_* modules a file imports."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module.removeprefix("dsv4bench.backends").lstrip(".")
            names = [a.name for a in node.names]
            if mod == "":
                found |= {n for n in names if n.startswith("triton_")}
            elif mod.startswith("triton_"):
                found.add(mod if mod != "triton_src" else "triton_src")
    return found


def test_host_modules_import_as_a_tree() -> None:
    for name, allowed in ALLOWED.items():
        assert _triton_imports(_tree(name)) <= allowed, name


def test_kernel_sources_import_no_host_module() -> None:
    for name in SOURCES:
        imported = _triton_imports(_tree(name))
        assert not imported & set(HOSTS), (name, imported)


def test_host_modules_never_bind_tl_or_import_triton_at_load() -> None:
    for name in HOSTS:
        tree = _tree(name)
        for node in tree.body:  # module level only: lazy imports inside functions are fine
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("triton") for a in node.names), name
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("triton"), name
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                assert "tl" not in node.names, name
            if isinstance(node, ast.Assign):
                assert all(getattr(t, "id", None) != "tl" for t in node.targets), name


def test_byte_offsets_follow_the_layout_table() -> None:
    from dsv4bench.backends.triton_src import layout as L

    v32, v4 = LAYOUTS["v32"], LAYOUTS["v4"]
    assert v32.token_bytes == L.V32_ROPE_AT + 2 * L.ROPE
    assert v32.d_nope == L.V32_SCALES_AT and v32.d_nope == L.V32_TILES * L.V32_TILE
    assert v4.token_bytes == L.V4_DATA_BYTES + L.V4_SCALE_BYTES
    assert v4.d_nope == L.V4_ROPE_AT and v4.d_nope == L.V4_TILES * L.V4_TILE
    assert set(L.FP8_LAYOUTS) <= set(LAYOUTS) and set(L.LAYOUT_IDS) <= set(LAYOUTS)
