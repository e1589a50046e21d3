"""The docs hold together: every Markdown file's code fences are balanced (an open fence turns
the rest of a page into code), and docs/scenarios.md's "Shipped scenarios" table is what
tools/scenario_table.py makes of scenarios/ (every file a row, its counts the loader's)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^\s*(```|~~~)")


def _markdown() -> list[str]:
    files = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return files or [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.md")]


def unbalanced(text: str) -> int | None:
    """The line of a fence left open at the end of `text`, else None."""
    open_at = None
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            open_at = None if open_at else number
    return open_at


def test_a_fence_left_open_is_found():
    assert unbalanced("a\n```\ncode\n```\nb\n") is None
    assert unbalanced("a\n\n```\nb\n") == 3


@pytest.mark.parametrize("path", _markdown())
def test_every_code_fence_is_closed(path):
    line = unbalanced((ROOT / path).read_text())
    assert line is None, f"{path}:{line}: a code fence opened here is never closed"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "scenario_table", ROOT / "tools/scenario_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_scenarios_table_is_made_from_scenarios():
    tool = _tool()
    have, want = tool.made(tool.DOC.read_text())
    files = sorted(
        p.relative_to(ROOT / "scenarios").as_posix() for p in (ROOT / "scenarios").rglob("*.yaml")
    )
    assert [line.split("`")[1] for line in want[2:]] == files
    assert have == want, "python tools/scenario_table.py rewrites docs/scenarios.md's table"
    smoke = next(line for line in have if line.startswith("| `smoke.yaml`"))
    assert "| reference-f64, torch |" in smoke


def test_the_readme_backend_table_lists_each_backends_ops():
    from dsv4bench import backends

    backends.setup([])
    checked = 0
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        names = re.findall(r"`([^`]+)`", cells[0]) if line.startswith("| `") else []
        if len(cells) < 4 or not names or names[0] not in backends.names():
            continue
        said = {op.strip().replace(" ", "_") for op in cells[-1].split(",")}
        ops = {op for name in names for op in backends.get(name).ops}  # a row of several: all
        assert said == ops or said == {"every_op"} and names == ["torch"], (names, said, ops)
        checked += len(names)
    assert checked >= 10


OWN_PATH = re.compile(r"(?<![\w./-])((?:dsv4bench|tools)/[\w./-]*[\w/])")


def test_every_path_of_the_suite_a_doc_names_exists():
    stale = []
    for path in _markdown():
        if path.startswith("results/"):  # a study's record names the tree of its run
            continue
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            for named in OWN_PATH.findall(line):
                if re.search(r"[A-Z*<]", named):  # NAME.py, a glob: a pattern, not a path
                    continue
                if not (ROOT / named.rstrip(".")).exists():
                    stale.append(f"{path}:{number}: {named}")
    assert not stale, stale
