"""The size budgets (issue 30, issue 48): the tracked tree stays under 15 MiB (study rows are
committed gzipped, PNGs only where a report or README cites them) and README.md at most
12 KiB (detail goes to docs/). CI runs this with `make test`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREE_BUDGET = 15 * 2**20
README_BUDGET = 12 * 2**10


def tracked_sizes(root: Path = ROOT) -> dict[str, int]:
    """Bytes of every file git tracks under `root` (a file deleted from the work tree: 0)."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.decode()
    paths = [p for p in listed.split("\0") if p]
    return {p: (root / p).stat().st_size if (root / p).is_file() else 0 for p in paths}


def over_budget(sizes: dict[str, int], budget: int) -> str | None:
    """One line naming the total and the largest files when `sizes` add up past `budget`."""
    total = sum(sizes.values())
    if total < budget:
        return None
    big = sorted(sizes.items(), key=lambda t: -t[1])[:5]
    named = ", ".join(f"{p} {n / 2**20:.2f} MiB" for p, n in big)
    return (
        f"tracked tree {total / 2**20:.2f} MiB, budget {budget / 2**20:.0f} MiB; largest: {named}"
    )


def test_the_tracked_tree_is_under_its_budget():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (no .git): the tracked files cannot be listed")
    sizes = tracked_sizes()
    assert len(sizes) > 100
    problem = over_budget(sizes, TREE_BUDGET)
    assert problem is None, problem


def test_the_readme_is_within_its_budget():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_BUDGET, (
        f"README.md is {size} bytes, at most {README_BUDGET}: move detail to docs/"
    )


def test_the_budget_check_names_the_largest_files():
    assert over_budget({"a": 10, "b": 5}, 16) is None
    problem = over_budget({"small.md": 2**20, "rows.jsonl": 15 * 2**20}, TREE_BUDGET)
    assert problem.startswith("tracked tree 16.00 MiB, budget 15 MiB; largest: rows.jsonl 15.00")
