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


def _figures(name: str):
    """The module of tools/figures/ named `name`, where its figures look their rows up."""
    _tool()  # puts tools/ on sys.path
    return importlib.import_module(f"figures.{name}")


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


def _row(case: str, backend: str, graph_ms: float, median_ms: float) -> dict:
    timing = {"graph_ms": graph_ms, "median_ms": median_ms}
    return dict(kind="case", case_id=case, backend=backend, status="ok", params={}, timing=timing)


def test_the_torch_topk_ratios_pair_rows_of_one_run_by_one_timer(monkeypatch):
    """x torch.topk divides by the `torch-topk` row of the same case in the same run (never the
    oracle's `torch` row, never another run's), both sides by the first timer both hold."""
    tool, topk = _tool(), _figures("topk")
    runs = {
        topk.TOPK_TT: [
            _row("a", "torch-topk", 2.0, 1.0),
            _row("a", "torch", 3.0, 9.0),
            _row("a", "sglang-topk", 1.0, 5.0),
            _row("b", "torch", 1.0, 1.0),  # no torch-topk row: no ratio
            _row("b", "sglang-topk", 7.0, 7.0),
        ],
        # the older run: a torch-topk row here must never pair with the run above
        topk.TOPK: [_row("b", "torch-topk", 0.5, 0.5), _row("b", "flashinfer", 1.0, 1.0)],
    }
    monkeypatch.setattr(_figures("common"), "rows", lambda path: runs.get(path, []))
    assert tool.FIGURES["topk_oracle_tt_span"]() == "1.50-1.50"
    assert tool.FIGURES["topk_sglang_tt_span"]() == "0.50-0.50"
    assert tool.FIGURES["topk_sglang_tt_rows"]() == "1 of 1"
    assert not any("flashinfer" in name and "tt" in name for name in tool.FIGURES)


def test_the_161k_figure_counts_the_last_row_of_each_search(monkeypatch):
    """A search rerun with the 161K probe replaces its older row; searches that never probed
    164864 are not counted; a failed 161K probe counts against."""
    tool = _tool()

    def limit(case: str, probes: dict) -> dict:
        return dict(kind="limit", case_id=case, backend="flashmla", status="ok", probes=probes)

    rows = [
        limit("old", {"131072": "ok", "1048576": "ok"}),
        limit("a", {"131072": "ok", "262144": "ok"}),
        limit("a", {"131072": "ok", "164864": "ok", "262144": "ok"}),
        limit("b", {"131072": "ok", "164864": "crash"}),
    ]
    monkeypatch.setattr(_figures("baseline"), "rows", lambda path: rows)
    assert tool.FIGURES["limit_161k"]() == "1 of 2"
