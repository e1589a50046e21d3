"""Every `from dsv4bench... import NAME` / `from reference... import NAME` in the tests, tools
and benchmarks names something that exists, imports inside functions included: GPU tests
import in their bodies, which a CPU run never executes, so a module moved without them
would only fail on a GPU."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for d in ("tests", "tools", "benchmarks") for p in (ROOT / d).rglob("*.py"))


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in ("dsv4bench", "reference"):
                yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("dsv4bench", "reference"):
                    yield node.lineno, a.name, []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_resolve(path: Path):
    missing = []
    for line, module, names in _imports(path):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{line}: {module} ({e})")
            continue
        for name in (n for n in names if n != "*"):
            if not hasattr(mod, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{line}: {module}.{name}")
    assert not missing, missing
