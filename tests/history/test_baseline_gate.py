"""The smoke baseline cannot fall behind its scenario: it holds a row for every smoke job, and
CI's compare (--require-base) fails a run holding a job the baseline lacks."""

from __future__ import annotations

import json
import shutil

from dsv4bench.commands.common import load
from tests.history.conftest import BASELINE, ROOT


def test_the_committed_baseline_holds_every_smoke_job():
    jobs, _, _ = load([str(ROOT / "scenarios" / "smoke.yaml")], None)
    planned = {(j.case.case_id, j.backend) for j in jobs}
    rows = [json.loads(line) for line in (BASELINE / "results.jsonl").open()]
    held = {(r["case_id"], r["backend"]) for r in rows}
    assert planned - held == set(), (
        "refresh: dsv4bench run scenarios/smoke.yaml --out results/cpu/smoke --quiet --force"
    )
    assert held - planned == set()


def test_ci_compare_requires_the_baseline_to_hold_each_job():
    script = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    (line,) = [x for x in script.splitlines() if x.startswith("python3 -m dsv4bench.cli compare")]
    assert "--require-base" in line.split()


def test_a_job_the_base_lacks_fails_compare_with_require_base(tmp_path, run_cli):
    base = tmp_path / "base"
    base.mkdir()
    lines = (BASELINE / "results.jsonl").read_text().splitlines(keepends=True)
    (base / "results.jsonl").write_text("".join(lines[:-2]))  # a baseline two jobs behind
    new = tmp_path / "new"
    shutil.copytree(BASELINE, new)
    code, out, _ = run_cli("compare", base, new, "--out", tmp_path / "c", "--time-threshold", "9")
    assert code == 0 and "0 not in base), 0 only in base, 2 only in new" in out
    code, out, _ = run_cli(
        "compare", base, new, "--out", tmp_path / "c2", "--time-threshold", "9", "--require-base"
    )
    assert code == 1 and "2 not in base), 0 only in base, 2 only in new" in out
    assert "refresh the baseline" in out
    code, _, err = run_cli("compare", base, new, "--partial", "--require-base")
    assert code == 2 and "expected one of them" in err
