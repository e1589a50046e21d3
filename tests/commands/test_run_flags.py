"""Run flags that used to be taken silently: a scenario named twice, --backend that no job
runs, --resume with --force, an empty --out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

QUICK = """
name: flags-test
op: decode
backends: [torch]
timing: {warmup: 0, iters: 2, flush_l2: false}
defaults: {context_len: 128, batch_size: 1, model: v3.2, topk: 64}
cases:
  - num_heads: [4, 8]
"""


@pytest.fixture
def quick(tmp_path) -> Path:
    path = tmp_path / "quick.yaml"
    path.write_text(QUICK)
    return path


def test_a_scenario_given_twice_runs_each_job_once(tmp_path, quick, run_cli):
    out = tmp_path / "r"
    code, _, err = run_cli("run", quick, quick, "--out", out, "--quiet")
    assert code == 0, err
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    keys = [(r["case_id"], r["backend"]) for r in rows]
    assert len(keys) == 2 and len(set(keys)) == 2


@pytest.mark.parametrize(
    "flags, why",
    [
        (("--backend", "flashmla"), "--backend flashmla: no job of these scenarios runs on it"),
        (("--resume", "--force"), "--resume goes on in RUN_DIR, --force starts over"),
        (("--out", ""), "--out '': expected a run directory"),
    ],
)
def test_contradictory_or_empty_flags_are_one_line_exit_2(tmp_path, quick, run_cli, flags, why):
    args = ["run", quick, *flags]
    if "--out" not in flags:
        args += ["--out", tmp_path / "r"]
    code, out, err = run_cli(*args)
    assert code == 2 and len(err.strip().splitlines()) == 1, out + err
    assert err.startswith(f"dsv4bench: {why}")
    assert not (tmp_path / "r").exists()
    assert "nothing to do" not in out


def test_unreadable_scenario_paths_are_one_line_exit_2(tmp_path, quick, run_cli):
    import os

    latin = tmp_path / "latin.yaml"
    latin.write_bytes(quick.read_bytes().replace(b"flags-test", b"flags-t\xe9st"))
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    loop, dangling = tmp_path / "loop.yaml", tmp_path / "dangling.yaml"
    loop.symlink_to(loop.name)
    dangling.symlink_to("gone.yaml")
    cases = [
        (loop, f"{loop}: a symbolic link loop (it resolves to itself), not a scenario file"),
        (dangling, f"{dangling}: a symbolic link to gone.yaml, which does not exist"),
        (latin, f"{latin}:2: (file): not UTF-8 text (byte 0xe9 at offset"),
        (tmp_path, f"{tmp_path}: is a directory, not a scenario file"),
        (fifo, f"{fifo}: not a regular file"),
        (tmp_path / "none.yaml", f"{tmp_path / 'none.yaml'}: no such scenario file"),
    ]
    for path, why in cases:
        for args in (("plan", path), ("run", path, "--out", tmp_path / "r")):
            code, _, err = run_cli(*args)
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert err.startswith(f"dsv4bench: {why}"), err
    assert not (tmp_path / "r").exists()


# The next two tests run in this order in one process (pytest keeps a file's order): the
# first leaves a plugin instance built, as tests/run/test_runner.py does; the second is a run.
def test_a_test_that_builds_a_plugin_instance(tmp_path):
    from dsv4bench import backends

    backends.setup(["tests.plugins.misbehaving"])
    backends.configure("isolated", {"build": "b1"}, "isolated-b1")
    assert "isolated-b1" in {i["name"] for i in backends.configured()}


def test_a_later_run_in_the_same_process_sends_no_leftover_instance(tmp_path, quick, capsys):
    from dsv4bench import backends, cli

    assert "isolated-b1" not in {i["name"] for i in backends.configured()}
    code = cli.main(["run", str(quick), "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 0, capsys.readouterr().err


def test_help_version_and_backends_read_well(run_cli, capsys):
    import re

    import pytest as _pytest

    from dsv4bench import cli

    with _pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"dsv4bench \d+\.\d+\.\d+\n", capsys.readouterr().out)
    with _pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "scenario scenario YAML files" in text
    assert "--plugin MODULE a module (or .py file) that registers more backends" in text
    assert "(default: runs)" in text and "(default: RUNS/<time>-<arch>)" in text
    code, out, _ = run_cli("backends")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == [
        "backend",
        "archs",
        "ops",
        "layouts",
        "kernels",
        "found",
    ]
    starts = {line.index(line.split()[1], len(line.split()[0])) for line in lines}
    assert len(starts) == 1  # the second column starts at one offset on every line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0"])
def test_a_time_threshold_that_is_no_positive_fraction_is_one_line_exit_2(tmp_path, run_cli, value):
    # nan compares false with everything: taken, it turned the time gate off
    run = Path(__file__).resolve().parents[2] / "results" / "cpu" / "smoke"
    code, out, err = run_cli(
        "compare", run, run, "--out", tmp_path / "c", f"--time-threshold={value}"
    )
    assert code == 2 and not out, out
    assert err.strip() == (
        f"dsv4bench: --time-threshold {float(value)}: expected a finite positive fraction"
    )
    assert not (tmp_path / "c").exists()


def test_run_refuses_a_scenario_written_for_another_machine_unless_arch_says_so(
    tmp_path, quick, run_cli
):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for a CPU")
    gpu_only = tmp_path / "gpu_only.yaml"
    gpu_only.write_text(QUICK + "arch: [sm90, sm100]\n")
    out = tmp_path / "r"
    # as the README's `run scenarios/sm90/*.yaml`: the file written for a CPU is not enough
    code, stdout, err = run_cli("run", quick, gpu_only, "--out", out, "--quiet")
    assert code == 2 and not stdout and len(err.strip().splitlines()) == 1, err
    assert err.strip() == (
        f"dsv4bench: {gpu_only}: written for arch sm90, sm100, and this machine has no GPU; "
        "--arch cpu runs it here anyway"
    )
    assert not out.exists()
    code, _, err = run_cli("run", gpu_only, "--arch", "cpu", "--out", out, "--quiet")
    assert code == 0, err
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


def test_resume_into_another_scenarios_run_is_refused_and_keeps_it(tmp_path, quick, run_cli):
    out = tmp_path / "r"
    assert run_cli("run", quick, "--out", out, "--quiet")[0] == 0
    kept = {p.name: p.read_bytes() for p in out.iterdir()}
    other = tmp_path / "other.yaml"
    other.write_text(QUICK.replace("flags-test", "other-test").replace("[4, 8]", "[2, 16]"))
    code, stdout, err = run_cli("run", other, "--out", out, "--resume", "--quiet")
    assert code == 2 and not stdout and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"dsv4bench: --resume {out}: holds rows of scenario flags-test, ")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == kept
    # the run's own files, with one more: --resume goes on as before
    code, _, err = run_cli("run", quick, other, "--out", out, "--resume", "--quiet")
    assert code == 0, err
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["scenario"] for r in rows] == ["flags-test"] * 2 + ["other-test"] * 2


@pytest.mark.parametrize(
    "nesting, line",
    [
        ("description: " + "[" * 600 + "]" * 600 + "\n", 9),  # flow style: all on one line
        ("description:\n" + "".join("  " * i + "a:\n" for i in range(1, 600)), 73),
    ],
)
def test_yaml_nested_hundreds_deep_is_one_line_exit_2(tmp_path, run_cli, nesting, line):
    # it was a RecursionError of 3,000 lines
    deep = tmp_path / "deep.yaml"
    deep.write_text(QUICK + nesting)
    for command in ("plan", "run"):
        code, out, err = run_cli(
            command, deep, *(["--out", tmp_path / "r"] if command == "run" else [])
        )
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        why = "nested more than 64 levels deep (a scenario nests a few)"
        assert err.strip() == f"dsv4bench: {deep}:{line}: (yaml): {why}"
    assert not (tmp_path / "r").exists()
