"""The Triton backend's module layering: the host modules and their kernel sources import each
other as a tree (backend -> attention, indexer, topk, cache_ops -> jit -> kernels.*; launch rules in
tuning), the host modules import without Triton and never assign `tl`, and the kernel sources
name their byte offsets from reference.layout_table. Read from the source files: no Triton
needed."""

from __future__ import annotations

import ast
from pathlib import Path

from reference.layout_table import LAYOUTS

TRITON = Path(__file__).resolve().parents[2] / "dsv4bench" / "backends" / "triton"
PACKAGE = "dsv4bench.backends.triton"
HOSTS = ("backend", "attention", "indexer", "topk", "cache_ops", "tuning", "jit")
SOURCES = ("cache", "attention", "indexer", "topk", "layout", "__init__", "gluon_attention",
           "gluon_parts", "gluon_producer", "gluon_resident")  # fmt: skip
# which modules of the Triton backend each host module may import (anywhere in the file)
ALLOWED = {
    "backend": {"attention", "indexer", "topk", "cache_ops", "jit"},
    "attention": {"jit", "tuning", "kernels.layout"},
    "cache_ops": {"jit", "attention"},
    "indexer": {"jit"},
    "topk": {"jit"},
    "tuning": {"kernels.layout"},
    "jit": set(),
}


def _tree(name: str, source: bool = False) -> ast.Module:
    """A host module's syntax tree, or with `source` a kernel source's."""
    return ast.parse((TRITON / ("kernels" if source else "") / f"{name}.py").read_text())


def _triton_imports(tree: ast.Module) -> set[str]:
    """The modules of dsv4bench.backends.triton a file imports ("kernels.layout", "jit")."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            mod = node.module.removeprefix(PACKAGE).lstrip(".")
            names = [a.name for a in node.names]
            if mod in ("", "kernels"):
                found |= {f"{mod}.{n}".lstrip(".") for n in names}
            else:
                found.add(mod)
    return found


def test_host_modules_import_as_a_tree() -> None:
    for name, allowed in ALLOWED.items():
        assert _triton_imports(_tree(name)) <= allowed, name


def test_kernel_sources_import_no_host_module() -> None:
    for name in SOURCES:
        imported = _triton_imports(_tree(name, source=True))
        assert all(m.startswith("kernels.") for m in imported), (name, imported)


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
    from dsv4bench.backends.triton.kernels import layout as L

    v32, v4 = LAYOUTS["v32"], LAYOUTS["v4"]
    assert v32.token_bytes == L.V32_ROPE_AT + 2 * L.ROPE
    assert v32.d_nope == L.V32_SCALES_AT and v32.d_nope == L.V32_TILES * L.V32_TILE
    assert v4.token_bytes == L.V4_DATA_BYTES + L.V4_SCALE_BYTES
    assert v4.d_nope == L.V4_ROPE_AT and v4.d_nope == L.V4_TILES * L.V4_TILE
    assert set(L.FP8_LAYOUTS) <= set(LAYOUTS) and set(L.LAYOUT_IDS) <= set(LAYOUTS)
