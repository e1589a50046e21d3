"""tools/readme_numbers.py: every figure the READMEs and docs mark is what the committed rows
say (`.ci/run` runs `--check` too), and a figure that no longer matches fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools/readme_numbers.py"


def _tool():
    spec = importlib.util.spec_from_file_location("readme_numbers", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_marked_figure_matches_the_committed_rows():
    r = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    marked = sum((ROOT / f).read_text().count("<!-- n:") for f in _tool().FILES)
    assert marked >= 15  # the figures are marked, not left as plain text


def test_a_stale_or_unknown_figure_fails_and_write_refreshes_it(tmp_path):
    tool = _tool()
    doc = tmp_path / "README.md"
    doc.write_text(
        "ragged takes <!-- n:ratio -->0.77-1.10<!-- /n -->x\n"
        "rows: <!-- n:rows -->276<!-- /n -->, <!-- n:nope -->1<!-- /n -->\n"
    )
    figures = {"ratio": lambda: "0.91-1.90", "rows": lambda: "276"}
    found = tool.problems(tmp_path, ["README.md"], figures)
    assert found == [
        "README.md:1: ratio reads '0.77-1.10', the rows say '0.91-1.90'",
        "README.md:2: unknown figure 'nope'",
    ]
    assert tool.write(tmp_path, ["README.md"], figures) == 1
    assert "<!-- n:ratio -->0.91-1.90<!-- /n -->" in doc.read_text()
    assert tool.problems(tmp_path, ["README.md"], figures) == ["README.md:2: unknown figure 'nope'"]


def test_a_figure_cut_short_or_run_on_fails(tmp_path):
    """The whole figure is compared: a prefix of it (or it with more after) is stale."""
    tool = _tool()
    figures = {"span": lambda: "0.91-1.90", "n": lambda: "27"}
    for cited in ("0.91-1.9", "0.91", "", "0.91-1.905"):
        (tmp_path / "README.md").write_text(f"<!-- n:span -->{cited}<!-- /n -->\n")
        found = tool.problems(tmp_path, ["README.md"], figures)
        assert found == [f"README.md:1: span reads {cited!r}, the rows say '0.91-1.90'"]
    (tmp_path / "README.md").write_text("<!-- n:n -->2<!-- /n -->7 rows\n")
    assert tool.problems(tmp_path, ["README.md"], figures) != []


def test_a_measured_figure_is_marked_or_dated_to_its_run(tmp_path):
    """In the findings and the study READMEs a measured figure (a time, ratio, percentage or
    error) outside a marker needs its run named in its paragraph or its section's heading: a
    tree commit, a date or the run's folder."""
    tool = _tool()
    (tmp_path / "README.md").write_text(
        "# study\n\n"
        "Kernel A takes 1.23x kernel B's time.\n\n"
        "- on tree 6b04eac: 0.41 ms against 0.52 ms\n"
        "- in `run/`: 4.5e-6 cos_diff\n"
        "- marked: <!-- n:r -->1.10x<!-- /n --> over 64 heads at batch 128\n"
        "- 27 cases, 64 heads, top-2048, vLLM 0.33.0\n\n"
        "```\nrun it: 3.2 ms\n```\n\n"
        "## Later (`results/sm90/studies/topk`)\n\n"
        "- 7.5 % of the step\n\n"
        "## Undated\n\n"
        "Its rows, 2026-11-21:\n\n"
        "| case | ms |\n|---|---|\n| a | 0.113 ms |\n\n"
        "- 12 % faster\n"
    )
    found = tool.undated(tmp_path, ["README.md"])
    assert [line.split(":")[1] for line in found] == ["3", "26"]
    assert found[0].startswith("README.md:3: '1.23x' is neither marked nor dated")
    # the shipped findings and study READMEs hold none
    assert tool.undated() == []
    assert "docs/findings.md" in tool.DATED and len(tool.DATED) >= 20
