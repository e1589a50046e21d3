"""`dsv4bench import vllm-bench`: vLLM's mla_sparse_decode.yaml (a copy in vllm/) converted,
the committed scenario kept equal to the conversion, planned for sm90, and a shrunk copy run
on the CPU through the oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench import backends, scenarios
from dsv4bench.interop.vllm.config import ConfigError, convert

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "vllm" / "mla_sparse_decode.yaml"
COMMITTED = ROOT / "scenarios" / "compare" / "vllm_mla_sparse_decode_sm90.yaml"
SOURCE = "benchmarks/attention_benchmarks/configs/mla_sparse_decode.yaml (commit d4897a7b484e)"
NAME = "vllm-mla-sparse-decode-sm90"
IMPORT = ("import", "vllm-bench", str(FIXTURE), "--source", SOURCE, "--name", NAME)


def load(text: str, name: str = "converted.yaml"):
    backends.setup([])
    return scenarios.load_text(text, name, known_backends=backends.catalog())


def test_conversion_carries_backends_model_heads_specs_and_repeats():
    sc = load(convert(FIXTURE.read_text(), source=SOURCE, name=NAME))
    assert sc.backends == ["flashmla", "flashinfer"] and sc.arch == ["sm90"]
    assert {c.model for c in sc.cases} == {"v3.2"}
    assert {c.num_heads for c in sc.cases} == {128, 64, 32, 16}
    assert {(c.timing.warmup, c.timing.iters) for c in sc.cases} == {(10, 100)}
    # 18 decode-only specs x 4 head counts: one decode case each, b and context as named
    assert len(sc.cases) == 72 and {c.op for c in sc.cases} == {"decode"}
    shapes = {(c.batch_size, c.context_len) for c in sc.cases}
    assert (16, 512) in shapes and (128, 8192) in shapes and (32, 32768) in shapes
    assert len(shapes) == 18


def test_committed_scenario_is_the_conversion(run_cli):
    code, out, err = run_cli(*IMPORT)
    assert code == 0, err
    assert out == COMMITTED.read_text()


def test_the_committed_scenario_plans_on_sm90(run_cli):
    code, out, err = run_cli("plan", str(COMMITTED), "--arch", "sm90")
    assert code == 0, err
    assert "on sm90: 144 supported" in out


def test_out_writes_the_file(run_cli, tmp_path):
    out = tmp_path / "s.yaml"
    code, _, err = run_cli(*IMPORT, "--out", str(out))
    assert code == 0, err
    assert out.read_text() == COMMITTED.read_text()


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (("- FLASHINFER_MLA_SPARSE", "- CUTLASS_MLA"), "backend 'CUTLASS_MLA' has no counterpart"),
        (('- "16q1s1k"', '- "16q1x1k"'), "bad batch_spec token '16q1x1k'"),
        (("head_dim: 576", "head_dim: 192"), "match no suite model"),
        (('param_name: "num_q_heads"', 'param_name: "block_size"'), "param_name 'block_size'"),
        (("repeats: 100", "repeats: 100\nbatch_spec_ranges: []"), "unsupported key"),
    ],
)
def test_unconvertible_configs_are_one_line_exit_2(run_cli, tmp_path, edit, says):
    bad = tmp_path / "bad.yaml"
    bad.write_text(FIXTURE.read_text().replace(*edit))
    code, out, err = run_cli("import", "vllm-bench", str(bad))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and says in err


def test_a_bad_batch_spec_in_a_scenario_is_one_line_exit_2(run_cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(COMMITTED.read_text().replace('"32q1s2k"', '"32q1s2k_"'))
    code, _, err = run_cli("plan", str(bad), "--arch", "sm90")
    assert code == 2 and err.count("\n") == 1
    assert "bad batch_spec token ''" in err and "[COUNT]q<Q>[k][s<S>[k]]" in err


def test_direct_conversion_errors_are_config_errors():
    with pytest.raises(ConfigError, match="expected a mapping"):
        convert("- just a list", source="x", name="x")
    with pytest.raises(ConfigError, match="not YAML"):
        convert("model: [unclosed", source="x", name="x")


def shrunk(text: str) -> str:
    """The committed scenario at CPU sizes: its header and keys, the CPU backends, two head
    counts either side of vLLM's 32-head route switch, toy batches of each kind."""
    head, _ = text.split("sweep:")
    head = head.replace("arch: [sm90]", "arch: [cpu]").replace(
        "backends: [flashmla, flashinfer]", "backends: [torch, reference-f64]"
    )
    head = head.replace("timing: {warmup: 10, iters: 100}", "timing: {warmup: 0, iters: 2}")
    return head + (
        "defaults: {topk: 32, page_size: 64}\n"
        "sweep:\n  num_heads: [32, 8]\n"
        'cases:\n  - batch_spec: ["4q1s128", "2q2s96_q40s128_3q1s64"]\n'
    )


def test_a_shrunk_copy_runs_on_the_cpu_through_the_oracle(run_cli, tmp_path):
    small = tmp_path / "vllm_small.yaml"
    small.write_text(shrunk(COMMITTED.read_text()))
    out = tmp_path / "run"
    code, _, err = run_cli("run", str(small), "--out", str(out), "--arch", "cpu", "--quiet")
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    checked = [r for r in rows if r["backend"] == "reference-f64"]
    assert checked and all(r["status"] == "ok" for r in checked), [r["message"] for r in rows]
    ops = {(r["params"]["op"], r["params"]["num_heads"], r["params"]["route"]) for r in rows}
    assert ("prefill", 8, "decode-mixed") in ops and ("prefill", 32, "sparse-prefill") in ops
    assert ("decode", 32, "sparse-prefill") in ops
    assert any("batch-spec:4q1s128" in r["tags"] for r in rows)


GPU_SPECS = """
name: vllm-batch-spec-gpu
arch: [sm90]
backends: [flashmla, flashinfer]
model: v3.2
timing: {warmup: 1, iters: 3}
sweep:
  num_heads: [128, 16]
cases:
  - batch_spec: ["16q1s512", "32q1s32k", "2q2k_32q1s1k", "16q4s1k", "q4s1k_2q4s2k_3q1s4k"]
"""


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flashmla", "flashinfer"])
def test_vllm_batches_run_ok_on_the_gpu_backends(backend):
    """The converted scenario's smallest and largest batches, a mixed batch, spec decode and a
    ragged decode, each part against the oracle."""
    from dsv4bench.run import worker

    sc = load(GPU_SPECS, "vllm-gpu.yaml")
    cache = worker.Cache()
    seen = 0
    for case in sc.cases:
        row, _ = worker.check(case, backends.get(backend), "sm90", cache)
        if row["status"] == "unsupported":
            print(backend, case.case_id, row["message"])
            continue
        assert row["status"] == "ok", (backend, case.case_id, row["message"])
        seen += 1
    assert seen >= 6


def test_out_never_overwrites_without_force(run_cli, tmp_path):
    out = tmp_path / "s.yaml"
    out.write_text("mine\n")
    code, _, err = run_cli(*IMPORT, "--out", str(out))
    assert code == 2 and err.count("\n") == 1 and "already exists; --force" in err
    assert out.read_text() == "mine\n"
    code, _, err = run_cli(*IMPORT, "--out", str(out), "--force")
    assert code == 0, err
    assert out.read_text() == COMMITTED.read_text()


def test_out_is_never_the_config_itself(run_cli, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(FIXTURE.read_text())
    for force in ((), ("--force",)):
        code, _, err = run_cli("import", "vllm-bench", str(config), "--out", str(config), *force)
        assert code == 2 and err.count("\n") == 1 and "is the input itself" in err
        assert config.read_text() == FIXTURE.read_text()


def test_a_config_that_is_not_utf8_is_one_line(run_cli, tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(FIXTURE.read_bytes() + b"# caf\xe9\n")
    code, out, err = run_cli("import", "vllm-bench", str(bad))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "not UTF-8 text" in err
