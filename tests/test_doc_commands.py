"""Commands the README and docs show run as shown (on a CPU, against the committed rows)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_python_api_snippet_of_docs_scenarios_runs(monkeypatch):
    text = (ROOT / "docs" / "scenarios.md").read_text()
    section = text.split("## Python API", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)
    # load_text's line shows a signature (`known_backends=...`): the rest runs as written
    runnable = "\n".join(line for line in code.splitlines() if "load_text" not in line)
    scope: dict = {}
    exec(compile(runnable, "docs/scenarios.md", "exec"), scope)
    assert scope["sc"].cases and scope["sc"].jobs()


def test_the_gpu_commands_need_no_installed_entry_point():
    # a GPU machine without a registry installs nothing: `dsv4bench` is not on its PATH there
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## On a GPU", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands and not [c for c in commands if c.startswith("dsv4bench ")]
    assert "`python -m dsv4bench.cli ARGS` is the same program" in " ".join(readme.split())
    p = subprocess.run(
        [sys.executable, "-m", "dsv4bench.cli", "report", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0 and "RUN_DIR" in p.stdout


def _findings() -> str:
    return " ".join((ROOT / "docs" / "findings.md").read_text().split())


def _rows(path: str) -> list[dict]:
    from dsv4bench.rows.results import read_rows

    return list(read_rows(ROOT / path))


def test_findings_index_set_difference_is_the_rows_worst():
    rows = _rows("results/sm90/studies/own-kernels/indexer")
    overlaps = [
        r["accuracy"]["topk_index_overlap"]
        for r in rows
        if (r.get("accuracy") or {}).get("topk_index_overlap") is not None
    ]
    worst = (1 - min(overlaps)) * 100
    assert f"index sets differ in up to {worst:.2f}% of picks" in _findings()


def test_findings_mixed_route_limits_name_the_builds_searched():
    builds: dict[str, set] = {}
    for r in _rows("results/sm90/studies/routes-limits/builds"):
        if (
            r.get("kind") == "limit"
            and r.get("first_fail")
            and r["params"].get("route") == ("decode-mixed")
        ):
            builds.setdefault(r["params"]["model"], set()).add(r["backend"])
    assert builds["v3.2"] == {"flashmla-0.26", "flashmla-0.33"}
    assert builds["v4-flash"] == {"flashmla-0.26"}
    assert "arithmetic says 58255) on both builds; V4-Flash 64512 / 65536 (searched on 0.26.0 " in (
        _findings()
    )


def test_make_gpu_test_lists_skip_reasons():
    # an H100 skipped 10 FlashInfer tests silently: every test target shows why it skipped
    p = subprocess.run(
        ["make", "-n", "gpu-test", "test", "PYTHON=python3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    runs = [line for line in p.stdout.splitlines() if " -m pytest " in line]
    assert len(runs) == 2 and all(" -rs " in line for line in runs), p.stdout


def test_the_findings_build_compare_finds_no_regression_as_it_says(run_cli, tmp_path):
    import re

    said = re.search(r"`compare RUN (--backends [^`]+)` finds no regression", _findings())
    assert said, "docs/findings.md quotes the builds' compare command"
    run = "results/sm90/studies/routes-limits/builds"
    code, out, err = run_cli("compare", run, *said.group(1).split(), "--out", tmp_path / "c")
    assert code == 0, out + err
    assert "compare: no regression" in out
