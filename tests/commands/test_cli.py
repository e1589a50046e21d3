"""The command line end to end: bad input, runs, resume/force, compare, report, benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.in_process import main_in_process

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "scenarios" / "smoke.yaml"


def cli(*args, env=None, check=None) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "dsv4bench.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    if check is not None:
        assert p.returncode == check, p.stdout + p.stderr
    return p


def ci_compare(out: Path) -> subprocess.CompletedProcess:
    """.ci/run's compare command, verbatim, with its `$out` set to `out` (holding smoke/)."""
    script = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    (line,) = [x for x in script.splitlines() if x.startswith("python3 -m dsv4bench.cli compare")]
    python_dir = str(Path(sys.executable).parent)
    return subprocess.run(
        ["bash", "-c", f'set -euo pipefail; out="{out}"; {line}'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PATH": python_dir + os.pathsep + os.environ["PATH"]},
        timeout=600,
    )


def decode_only(tmp_path: Path) -> Path:
    """A quick scenario: the smoke file's decode points only."""
    text = """
name: cli-test
op: decode
backends: [torch]
timing: {warmup: 1, iters: 8}
defaults: {context_len: 256, batch_size: 2}
cases:
  - model: v3.2
    num_heads: 8
    topk: 64
  - model: v4-flash
    num_heads: 8
    extra_topk: 64
"""
    path = tmp_path / "quick.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """One run of decode_only's scenario, shared (copy it before changing it)."""
    tmp = tmp_path_factory.mktemp("quick")
    out = tmp / "run"
    assert main_in_process("run", decode_only(tmp), "--out", out, "--quiet") == 0
    return out


def test_malformed_scenario_is_one_line_exit_2_and_writes_nothing(tmp_path, run_cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nop: decode\nbackends: [torch]\nsweep:\n  batch_size: [1, -4]\n")
    out = tmp_path / "run"
    for cmd in (("plan", bad), ("run", bad, "--out", out)):
        code, _, err = run_cli(*cmd)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert f"{bad}:5: sweep.batch_size[1]" in lines[0]
        assert "positive" in lines[0]
    assert not out.exists()


def test_bad_flags_exit_2(tmp_path, capsys, run_cli):
    code, _, err = run_cli("plan", SMOKE, "--backend", "nope")
    assert code == 2 and "unknown backend" in err
    with pytest.raises(SystemExit) as e:  # argparse's own one-line error
        run_cli("run", SMOKE, "--arch", "sm75")
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    code, _, err = run_cli("run", SMOKE, "--plugin", "no.such.module", "--out", tmp_path / "r")
    assert code == 2 and "cannot import" in err and not (tmp_path / "r").exists()


def test_run_refuses_to_overwrite_then_resumes_and_forces(tmp_path, quick_run, run_cli):
    quick = decode_only(tmp_path)
    out = tmp_path / "run"
    shutil.copytree(quick_run, out)
    first = (out / "results.jsonl").read_text()
    assert len(first.splitlines()) == 2
    code, _, err = run_cli("run", quick, "--out", out)
    assert code == 2 and "--resume" in err and (out / "results.jsonl").read_text() == first
    (out / "results.jsonl").write_text(first[:-30])  # killed while writing the last row
    code, _, err = run_cli("run", quick, "--out", out, "--resume", "--quiet")
    assert code == 0 and "torn last line moved to" in err
    assert (out / "results.jsonl.torn").exists()
    again = (out / "results.jsonl").read_text()
    assert [json.loads(line)["case_id"] for line in again.splitlines()] == [
        json.loads(line)["case_id"] for line in first.splitlines()
    ]  # the torn row ran again, whole
    assert run_cli("run", quick, "--out", out, "--resume")[0] == 0
    assert (out / "results.jsonl").read_text() == again  # nothing left to do
    commands = (out / "command.txt").read_text().splitlines()
    assert len(commands) == 3 and "--resume" not in commands[0] and "--resume" in commands[2]
    (out / "report.md").write_text("an old report\n")
    (out / "old.png").write_bytes(b"")
    assert run_cli("run", quick, "--out", out, "--force", "--quiet")[0] == 0
    (earlier,) = out.glob("earlier-*")  # the earlier run, reports and plots too, kept aside
    assert (earlier / "results.jsonl").read_text() == again
    assert (earlier / "report.md").exists() and (earlier / "old.png").exists()
    assert not (out / "report.md").exists() and not (out / "old.png").exists()


def test_crashes_become_rows_while_other_cases_run_and_unexpected_ones_fail_the_run(
    tmp_path, run_cli
):
    text = """
name: crash-test
op: decode
backends: [torch, crashy] # each case's crash comes last: two worker starts in all
timing: {warmup: 0, iters: 2, timeout_s: 60}
defaults: {model: v3.2, num_heads: 4, topk: 64, context_len: 128, page_size: 64}
cases:
  - batch_size: [1, 5]
  - batch_size: 4
    tags: [expect-failure]
"""
    path = tmp_path / "crash.yaml"
    path.write_text(text)
    out = tmp_path / "run"
    code, _, err = run_cli("run", path, "--plugin", "tests.plugins.misbehaving", "--out", out)
    assert code == 1, err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    status = {(r["params"]["batch_size"], r["backend"]): r["status"] for r in rows}
    assert status == {
        (1, "crashy"): "ok",
        (1, "torch"): "ok",
        (4, "crashy"): "crash",
        (4, "torch"): "ok",
        (5, "crashy"): "crash",
        (5, "torch"): "ok",
    }
    # batch 4 was expected to crash: only batch 5 fails the run
    (b5,) = [
        r["case_id"] for r in rows if r["params"]["batch_size"] == 5 and r["backend"] == "torch"
    ]
    assert f"1 case(s) failed (crash), e.g. {b5} crashy: crash" in err


def test_compare_flags_slowed_and_wrong_builds_and_passes_unchanged(tmp_path, quick_run, run_cli):
    quick = decode_only(tmp_path)
    base = quick_run
    assert run_cli("compare", base, base, "--out", tmp_path / "same")[0] == 0
    for mode in ("slow", "wrong"):
        new = tmp_path / mode
        # 50 ms per call: 20x these cases' times, far past the 5% threshold and their noise
        env = {"DSV4BENCH_REGRESSION": mode, "DSV4BENCH_REGRESSION_DELAY_S": "0.05"}
        plugin = ("--plugin", "tests.plugins.regressed")
        # a wrong build's rows are `incorrect`: run itself fails; a slow one passes
        code, _, err = run_cli("run", quick, *plugin, "--out", new, "--quiet", env=env)
        assert code == int(mode == "wrong"), err
        code, out, _ = run_cli("compare", base, new, "--out", tmp_path / f"cmp-{mode}")
        assert code == 1 and "regress" in out.lower()
        assert (tmp_path / f"cmp-{mode}" / "compare.md").exists()


def test_ci_time_gate_fails_a_slowed_smoke_run(tmp_path, run_cli):
    # the smoke file's V3.2 decode points alone (the same case ids, so compare matches them
    # with the CPU baseline), on a build 30 ms a call slower: ~14x their baseline medians
    smoke = yaml.safe_load(SMOKE.read_text())
    smoke["cases"] = smoke["cases"][:1]
    subset = tmp_path / "smoke.yaml"
    subset.write_text(yaml.safe_dump(smoke))
    out = tmp_path / "ci"
    env = {"DSV4BENCH_REGRESSION": "slow", "DSV4BENCH_REGRESSION_DELAY_S": "0.03"}
    plugin = ("--plugin", "tests/plugins/regressed.py", "--backend", "torch")
    assert run_cli("run", subset, *plugin, "--out", out / "smoke", "--quiet", env=env)[0] == 0
    p = ci_compare(out)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "compare: REGRESSION: 4 matched, " in p.stdout
    assert "(4 time, 0 accuracy, 0 status, 0 limit, " in p.stdout
    assert (out / "compare" / "compare.md").exists()


def test_report_from_a_run(tmp_path, quick_run, run_cli):
    out = tmp_path / "run"
    shutil.copytree(quick_run, out)
    assert run_cli("report", out, "--in-place")[0] == 0
    assert (out / "report.html").exists() and list(out.glob("*.png"))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_report_and_compare_leave_a_committed_run_as_it_is(tmp_path, monkeypatch, capsys):
    from dsv4bench import cli as dsv4cli

    run = ROOT / "results" / "cpu" / "smoke"
    before = snapshot(run)
    monkeypatch.chdir(tmp_path)
    assert dsv4cli.main(["report", str(run)]) == 0
    assert dsv4cli.main(["compare", str(run), str(run)]) == 0
    assert snapshot(run) == before
    assert (tmp_path / "reports" / "smoke" / "report.md").is_file()
    assert (tmp_path / "reports" / "compare-smoke" / "compare.md").is_file()
    # the run is written into only when asked, and never both ways at once
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        dsv4cli.main(["report", str(run), "--in-place", "--out", str(tmp_path)])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_compare_names_its_default_folder_after_both_runs_and_instances():
    from dsv4bench.commands.read import compare_name

    base, new = Path("results/cpu/smoke"), Path("runs/mine")
    assert compare_name(base, new, None) == "compare-smoke-vs-mine"
    assert compare_name(base, base, ["fm-0.26", "fm-0.33"]) == "compare-smoke-fm-0.26-vs-fm-0.33"


def pytest_run(*args) -> subprocess.CompletedProcess:
    """A pytest session of its own, as a user starts one: not marked as the child of an xdist
    worker (`make test` runs two), which would switch pytest-benchmark off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )


def test_benchmarks_fail_on_accuracy_and_record_the_rest(tmp_path):
    # one pytest process for both backends: the right one's benchmarks pass into the JSON,
    # the wrong one's fail the session
    p = pytest_run(
        "benchmarks",
        "--benchmark-only",
        "-q",
        "--scenario",
        decode_only(tmp_path),
        "--plugin",
        "tests.plugins.misbehaving",
        "--bench-backend",
        "torch",
        "--bench-backend",
        "wrong",
        "--benchmark-json",
        tmp_path / "bench.json",
    )
    assert p.returncode == 1, p.stdout[-2000:]
    assert "2 failed, 2 passed" in p.stdout, p.stdout[-2000:]
    failed = [line for line in p.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 2 and all(line.split(" ")[1].endswith("-wrong]") for line in failed)
    data = json.loads((tmp_path / "bench.json").read_text())
    benchmarks = [b["extra_info"] for b in data["benchmarks"]]
    assert [(b["backend"], b["status"]) for b in benchmarks] == [("torch", "ok")] * 2


def test_bench_for_a_gpu_this_machine_lacks_is_refused(tmp_path, run_cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    code, _, err = run_cli("bench", "--arch", "sm90", "--out", tmp_path / "r")
    assert code == 2 and err.strip() == "dsv4bench: make bench ARCH=sm90: this machine has no GPU"
    assert not (tmp_path / "r").exists()


def test_bench_without_a_gpu_runs_the_smoke_scenario(tmp_path, run_cli):
    import torch

    from dsv4bench.backends.f64.backend import ReferenceF64

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    out = tmp_path / "ci" / "smoke"
    code, stdout, err = run_cli("bench", "--out", out, "--quiet")
    assert code == 0 and f"results: {out / 'results.jsonl'}" in stdout, err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["scenario"] for r in rows} == {"smoke"}
    assert all(r["status"] == "ok" for r in rows if r["op"] in ReferenceF64.ops)
    assert {r["status"] for r in rows} <= {"ok", "unsupported"}
    # CI's time gate passes an unchanged build on this (shared, busy) machine
    p = ci_compare(tmp_path / "ci")
    assert p.returncode == 0, p.stdout + p.stderr


def test_io_errors_are_one_line_exit_2_and_keep_what_was_written(tmp_path, capsys, monkeypatch):
    from dsv4bench import cli as dsv4cli
    from dsv4bench.rows.results import ResultWriter, read_rows

    quick = decode_only(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("not a run directory\n")
    assert dsv4cli.main(["run", str(quick), "--out", str(afile)]) == 2
    assert capsys.readouterr().err == f"dsv4bench: --out {afile}: is a file, not a run directory\n"
    assert afile.read_text() == "not a run directory\n"

    # compare into a directory that cannot be made (a real I/O error, even for root)
    base = ROOT / "results" / "cpu" / "smoke"
    assert dsv4cli.main(["compare", str(base), str(base), "--out", str(afile / "cmp")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dsv4bench: {afile / 'cmp'}: ")

    # the disk refuses the second row of a run: the first stays, one line, exit 2
    out = tmp_path / "run"
    append = ResultWriter.append

    def refuse_second(self, row):
        if read_rows(self.path, quiet=True):
            raise OSError(30, "Read-only file system", str(self.path))
        append(self, row)

    monkeypatch.setattr(ResultWriter, "append", refuse_second)
    assert dsv4cli.main(["run", str(quick), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"dsv4bench: {out / 'results.jsonl'}: Read-only file system"
    assert len(read_rows(out)) == 1


@pytest.mark.parametrize("name", ["results.jsonl", "bench.json"])
def test_report_of_a_file_writes_beside_it(tmp_path, capsys, name):
    from dsv4bench import cli as dsv4cli

    source = ROOT / "results" / "cpu" / "smoke" / "results.jsonl"
    path = tmp_path / name
    path.write_bytes(source.read_bytes())
    if name == "bench.json":  # the smoke rows as pytest-benchmark would have written them
        rows = [json.loads(line) for line in source.read_text().splitlines()[:6]]
        bench = [
            {"name": r["case_id"], "extra_info": r, "stats": {"median": 1e-4, "data": [1e-4]}}
            for r in rows
        ]
        path.write_text(json.dumps({"benchmarks": bench}))
    assert dsv4cli.main(["report", str(path), "--in-place"]) == 0
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.html").exists()
    assert str(tmp_path / "report.md") in capsys.readouterr().out


def test_plan_without_a_gpu_is_for_the_scenarios_archs_and_says_so(capsys):
    import torch

    from dsv4bench import cli as dsv4cli

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    assert dsv4cli.main(["plan", str(ROOT / "scenarios" / "sm100" / "decode_batch.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    jobs = [line.split() for line in out if line.startswith("decode-")]
    assert jobs and {j[2] for j in jobs} == {"sm100"}
    assert {j[3].rstrip(":") for j in jobs if j[1] == "flashinfer"} == {"supported"}
    assert out[-1].endswith("sm100-decode-batch: the scenario's arch; this machine has no GPU")
    assert dsv4cli.main(["plan", str(SMOKE), "--arch", "sm90"]) == 0
    out = capsys.readouterr().out.splitlines()
    jobs = [line.split() for line in out if line.split()[0].startswith(("decode-", "remap-"))]
    assert jobs and {j[2] for j in jobs} == {"sm90"} and out[-1].endswith("smoke: --arch")


def test_plan_of_a_serving_file(capsys):
    from dsv4bench import cli as dsv4cli

    path = ROOT / "scenarios" / "serving" / "v4_flash_backends_sm90.yaml"
    assert dsv4cli.main(["plan", str(path), "--arch", "sm90"]) == 0
    out = capsys.readouterr().out.splitlines()
    # 24 attention cases on flashmla, triton, flashinfer and fa3, plus their helper parts
    assert out[-1].startswith("112 jobs, 0 limit searches; planned for serving-v4-flash-backends")


def test_retry_failed_needs_resume(tmp_path, capsys):
    from dsv4bench import cli as dsv4cli

    out = tmp_path / "r"
    assert dsv4cli.main(["run", str(SMOKE), "--out", str(out), "--retry-failed"]) == 2
    assert "--retry-failed goes with --resume" in capsys.readouterr().err and not out.exists()


def test_a_dotted_plugin_loads_from_the_current_directory_as_in_the_readme(monkeypatch):
    from dsv4bench import backends

    monkeypatch.chdir(ROOT)
    # a console script's sys.path: no current directory, no checkout
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(ROOT), ".")])
    for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
        monkeypatch.delitem(sys.modules, name)
    backends.load_plugin("tests.plugins.misbehaving")  # raises PluginError if not importable
    assert "tests.plugins.misbehaving" in sys.modules and "crashy" in backends.names()


def test_pytest_output_stays_short(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nop: decode\nbackends: [torch]\nsweep:\n  batch_size: [1, -4]\n")
    p = pytest_run("benchmarks", "--benchmark-only", "--scenario", bad)
    assert p.returncode == 4 and "Traceback" not in p.stdout + p.stderr
    assert f"--scenario: {bad}:5: sweep.batch_size[1]" in p.stderr
    p = pytest_run("--benchmark-only", "-q", "tests/rows/test_results.py")
    assert p.returncode == 0 and "SKIPPED" not in p.stdout  # no line per skipped unit test
    make_test = (ROOT / "Makefile").read_text().split("\ntest:")[1].splitlines()[1]
    flags = shlex.split(make_test.split("pytest", 1)[1])
    # in one process: under xdist pytest-benchmark switches itself off, table or not
    for opt in ("-n", "--dist"):
        if opt in flags:
            del flags[flags.index(opt) : flags.index(opt) + 2]
    p = pytest_run(*flags, "benchmarks", "--scenario", decode_only(tmp_path))
    assert p.returncode == 0 and "Name (time in" not in p.stdout  # no benchmark table


def test_bench_on_a_gpu_runs_its_arch_set_and_every_build(monkeypatch):
    from dsv4bench.commands import run as run_command

    seen = {}
    monkeypatch.setattr(run_command, "present_arch", lambda arch, what: "sm90")
    monkeypatch.setattr(run_command, "_bench_gpus", lambda: "0")
    monkeypatch.setattr(run_command, "_run", lambda args, paths: seen.setdefault("paths", paths))
    run_command.cmd_bench(argparse.Namespace(arch=None, gpus=None))
    names = [Path(p).relative_to(run_command.SCENARIO_DIR).as_posix() for p in seen["paths"]]
    assert names[-1] == "compare/builds_sm90.yaml"
    assert "sm90/decode_batch.yaml" in names and "sm90/indexer.yaml" in names
    assert not any(n.startswith("compare/") for n in names[:-1])


def test_backend_flag_names_an_instance_a_scenario_defines(run_cli):
    builds = "scenarios/compare/builds_sm90.yaml"
    only = ("--backend", "flashinfer-0.6.18-past")
    code, out, err = run_cli("plan", builds, "--arch", "sm90", *only)
    assert code == 0, err
    assert "flashinfer-0.6.18-past" in out and "flashinfer-0.7.2.post1-past" not in out
    assert "0 jobs, 1 limit searches" in out
