"""Commands the README and docs show run as shown (on a CPU, against the committed rows)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_summarize_prints_the_readme_numbers_from_the_committed_rows():
    readme = " ".join((ROOT / "README.md").read_text().split())
    command = (
        "python tools/summarize.py results/sm90/h200-bench-1 results/sm90/h200-bench-2 "
        "results/sm90/h200-serving"
    )
    assert command in readme
    p = subprocess.run(
        [sys.executable, *command.split()[1:]], capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr[-2000:]
    tpot = [line for line in p.stdout.splitlines() if line.startswith("TPOT ")]
    assert tpot and any(line.endswith(" ms") for line in tpot)


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
