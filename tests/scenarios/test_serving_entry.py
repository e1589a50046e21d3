"""Serving files are the scenario loader's second kind of entry: same reader, same errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bench import scenarios
from dsv4bench.scenarios import ScenarioError
from dsv4bench.serving import ServingSpec

BASE = "op: serving\nmodel: v4-flash\nbatch_sizes: [1]\ncontexts: [8K]\n"


def _load(tmp_path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path, scenarios.load_any(path, known_backends={"torch": {}, "flashmla": {}})


def test_one_loader_reads_both_kinds(tmp_path):
    _, spec = _load(tmp_path, BASE + "name: mine\ntiming: {iters: 5}\n")
    assert isinstance(spec, ServingSpec) and spec.scenario == "mine" and spec.timing.iters == 5
    smoke = Path(__file__).resolve().parents[2] / "scenarios" / "smoke.yaml"
    known = {"torch": {}, "reference-f64": {}}
    assert isinstance(scenarios.load_any(smoke, known_backends=known), scenarios.Scenario)


@pytest.mark.parametrize(
    ("extra", "line", "path", "words"),
    [
        ("timing: {iters: lots}\n", 5, "timing.iters", "positive integer"),
        ("tolerance: {cos: 1}\n", 5, "tolerance.cos", "expected one of: cos_diff"),
        ("head_padding: 96\n", 5, "head_padding", "engine, none, raw, 64, 128"),
        ("contexts: [1]\n", 5, "contexts", "duplicate key (first given at line 4)"),
        ("bach_sizes: [1]\n", 5, "bach_sizes", "did you mean batch_sizes"),
        ("tp: 3\n", 5, "tp", "divisor"),
    ],
)
def test_serving_errors_name_file_line_and_key(tmp_path, extra, line, path, words):
    with pytest.raises(ScenarioError) as e:
        _load(tmp_path, BASE + extra)
    assert str(e.value).startswith(f"{tmp_path / 's.yaml'}:{line}: {path}:")
    assert words in str(e.value)


def test_the_command_line_reads_each_scenario_file_once(monkeypatch):
    from dsv4bench import cli

    root = Path(__file__).resolve().parents[2] / "scenarios"
    files = [root / "smoke.yaml", root / "serving" / "v4_flash_sm90.yaml"]
    reads: list[str] = []
    for method in ("read_bytes", "read_text"):
        real = getattr(Path, method)
        spy = lambda p, *a, real=real, **k: reads.append(p.name) or real(p, *a, **k)  # noqa: E731
        monkeypatch.setattr(Path, method, spy)
    jobs, _, specs = cli._load([str(f) for f in files], None)
    assert jobs and len(specs) == 1
    assert sorted(reads) == sorted(f.name for f in files)


def test_a_serving_file_defines_backend_instances_as_kernel_scenarios_do(tmp_path):
    known = {"torch": {}, "q8kv8": {"lib": None, "time_q_cast": False}}
    entry = "backends: [{name: q8kv8, as: q8kv8-qcast, time_q_cast: true}]\n"
    path = tmp_path / "s.yaml"
    path.write_text(BASE + entry)
    spec = scenarios.load_any(path, known_backends=known)
    assert spec.backends == ["q8kv8-qcast"]
    (inst,) = spec.instances
    assert (inst["name"], inst["base"], inst["options"]) == ("q8kv8-qcast", "q8kv8",
                                                             {"time_q_cast": True})  # fmt: skip
    path.write_text(BASE + entry.replace("time_q_cast", "time_the_cast"))
    with pytest.raises(ScenarioError, match=r"s.yaml:5: backends\[0\].time_the_cast"):
        scenarios.load_any(path, known_backends=known)


def test_the_v4_q8kv8_preset_times_the_q_cast_on_chunks_sglang_sends_to_it():
    """sglang's DSv4 backend casts q per call and sends only chunks of more than 11673 tokens
    to sparse prefill (SGLANG_DSV4_THRESHOLD): the preset's rows must be of that call."""
    from dsv4bench import backends, serving
    from dsv4bench.commands.common import load
    from dsv4bench.measure.hardware import SGLANG_DSV4_THRESHOLD
    from dsv4bench.serving import presets

    root = Path(__file__).resolve().parents[2]
    path = root / "scenarios/serving/presets_q8kv8_v4_flash_sm90.yaml"
    jobs, _, (spec,) = load([str(path)], None)
    (preset,) = [p for p in presets.PRESETS if p.name == "sglang-hopper-v4-q8"]
    assert preset.prefill in spec.backends
    assert backends.get(preset.prefill).time_q_cast is True  # configured by the file
    assert max(spec.chunk_sizes) > SGLANG_DSV4_THRESHOLD
    q8 = [j.case for j in jobs if j.backend == preset.prefill]
    assert max(c.tokens for c in q8) > SGLANG_DSV4_THRESHOLD
    assert {c.op for c in q8} == {"prefill"}
    assert serving.jobs_for(spec)  # planned
