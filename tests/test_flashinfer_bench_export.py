"""flashinfer-bench export, as their harness reads it: every workload sized by its definition
(dumped or not), every output axis an input's or a constant, a ragged batch's tensors declared,
every row status mapped, the oracle's latency present or marked absent, and the exported
solution wrappers runnable on the CPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dsv4bench import cli
from dsv4bench.cases.case import Case
from dsv4bench.rows.results import read_rows
from tests.factories import write_run

pytest.importorskip("flashinfer_bench.data", reason="flashinfer-bench (make install) is absent")

ROOT = Path(__file__).resolve().parent.parent
BUILDS = ROOT / "results/sm90/studies/builds/flashinfer"  # no torch rows
BASELINE = ROOT / "results/sm90/baseline-h100"  # every op family of the sm90 sweep
WORKLOADS = ROOT / "results/sm90/studies/workloads/results.jsonl.gz"
# a ragged batch of V4-Flash window layers (V4 passes topk_length) and its uniform twin: the
# same constant fields
RAGGED, UNIFORM = (
    "decode-v4-flash-v4-h64-b16-k128-3259115da9",
    "decode-v4-flash-v4-h64-b16-k128-8ac780df23",
)


def _export(run: Path, out: Path, *flags: str):
    from flashinfer_bench.data import TraceSet

    assert cli.main(["export", "flashinfer-bench", str(run), "--out", str(out), *flags]) == 0
    return TraceSet.from_path(str(out))


def _rows(run: Path) -> list[dict]:
    return list(read_rows(run))


def _cases(run: Path) -> dict[str, Case]:
    return {r["case_id"]: Case(scenario=r["scenario"], **r["params"]) for r in _rows(run)}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, Path]:
    """A CPU run of every op (the oracle `torch` and `reference-f64`) and its export, every
    case's tensors dumped."""
    tmp = tmp_path_factory.mktemp("smoke")
    run = tmp / "run"
    argv = ["run", str(ROOT / "scenarios/smoke.yaml"), "--arch", "cpu", "--out", str(run)]
    assert cli.main([*argv, "--backend", "torch", "--backend", "reference-f64", "--quiet"]) == 0
    _export(run, tmp / "fib")
    return run, tmp / "fib"


@pytest.fixture(scope="module")
def undumped(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """Committed sm90 runs exported with no tensors (--max-dump-mib 0): {name: (run, traces)}."""
    out = {}
    for run in (BUILDS, BASELINE):
        folder = tmp_path_factory.mktemp(run.name)
        out[run.name] = run, _export(run, folder, "--max-dump-mib", "0")
    return out


def _exports(smoke, undumped):
    from flashinfer_bench.data import TraceSet

    return [*undumped.values(), (smoke[0], TraceSet.from_path(str(smoke[1])))]


def test_every_workload_is_sized_by_its_definition(smoke, undumped):
    """Their harness makes a workload's inputs from its axes (Definition.get_input_shapes): a
    case too large to dump included, the shapes are the case's own."""
    from dsv4bench.cases.input_shapes import input_shapes

    for run, traces in _exports(smoke, undumped):
        cases = _cases(run)
        assert traces.workloads
        for name, workloads in traces.workloads.items():
            definition = traces.definitions[name]
            for w in (t.workload for t in workloads):
                want = input_shapes(cases[w.uuid])
                assert set(w.inputs) == set(definition.inputs) == set(want), w.uuid
                got = definition.get_input_shapes(w.axes)
                assert [tuple(s) for s in got] == [want[k].dims for k in definition.inputs]


def test_every_output_axis_is_an_input_axis_or_a_constant(smoke, undumped):
    """Their runner sizes the outputs from the inputs; the indexer's top-k is a constant."""
    for _, traces in _exports(smoke, undumped):
        for definition in traces.definitions.values():
            known = {a for t in definition.inputs.values() for a in t.shape or ()}
            known |= set(definition.const_axes)
            for name, t in definition.outputs.items():
                assert set(t.shape) <= known, f"{definition.name} {name}: {t.shape}"
            if "topk_indices" in definition.outputs:
                assert "topk" in definition.const_axes, definition.name
    names = {n for _, traces in _exports(smoke, undumped) for n in traces.definitions}
    for op in ("decode", "prefill", "indexer", "topk", "dequant", "remap", "page_split"):
        assert any(n.startswith(f"dsv4bench_{op}_") for n in names), op
    assert any("decodekernel" in n or "decodemixed" in n for n in names)


def test_a_dumped_ragged_batch_carries_only_its_definitions_inputs(tmp_path):
    """A ragged V4 decode batch passes topk_length: its definition (not the uniform twin's)
    declares it, and each case's safetensors hold its definition's inputs."""
    import safetensors.torch

    with gzip.open(WORKLOADS, "rt") as f:
        rows = [json.loads(x) for x in f]
    run = write_run(tmp_path / "run", [r for r in rows if r.get("case_id") in (RAGGED, UNIFORM)])
    out = tmp_path / "fib"
    traces = _export(run, out, "--max-dump-mib", "64")  # 3.3 MiB of tensors each
    seen = {}
    for name, workloads in traces.workloads.items():
        for w in (t.workload for t in workloads):
            paths = {spec.path for spec in w.inputs.values()}
            assert len(paths) == 1, "one safetensors file per workload"
            blob = safetensors.torch.load_file(str(out / paths.pop()))
            assert set(blob) == set(traces.definitions[name].inputs)
            seen[w.uuid] = name, set(blob)
    assert seen[RAGGED][0] != seen[UNIFORM][0]
    assert "topk_length" in seen[RAGGED][1] and "topk_length" not in seen[UNIFORM][1]


def test_timeout_and_oom_rows_are_traces_with_their_message(tmp_path):
    from flashinfer_bench.data import TraceSet

    crash = next(r for r in _rows(BUILDS) if r["status"] == "crash")
    rows = [
        {**crash, "backend": "flashinfer-a", "status": "timeout", "message": "timed out (300 s)"},
        {**crash, "backend": "flashinfer-b", "status": "oom", "message": "CUDA out of memory"},
    ]
    out = tmp_path / "fib"
    _export(write_run(tmp_path / "run", rows), out, "--max-dump-mib", "0")
    traces = [t for ts in TraceSet.from_path(str(out)).traces.values() for t in ts]
    got = {t.solution.split("__")[0]: t.evaluation for t in traces}
    assert {k: e.status.value for k, e in got.items()} == {
        "dsv4bench_flashinfer-a": "TIMEOUT",
        "dsv4bench_flashinfer-b": "RUNTIME_ERROR",
    }
    assert "dsv4bench status timeout: timed out (300 s)" in got["dsv4bench_flashinfer-a"].log
    assert "dsv4bench status oom: CUDA out of memory" in got["dsv4bench_flashinfer-b"].log
    assert all(e.correctness is None and e.performance is None for e in got.values())


def test_oracle_latency_is_the_torch_rows_or_marked_absent(smoke, undumped):
    """With a `torch` row of the case: its median, and the speedup over it. Without: their
    numbers stay 0 and the log and extra say the oracle was not timed."""
    from flashinfer_bench.data import TraceSet

    from dsv4bench.interop.flashinfer_bench.export import NO_ORACLE

    run, out = smoke
    oracle = {r["case_id"]: r["timing"]["median_ms"] for r in _rows(run) if r["backend"] == "torch"}
    timed = [
        t.evaluation
        for ts in TraceSet.from_path(str(out)).traces.values()
        for t in ts
        if "_reference-f64__" in t.solution
        and t.evaluation.status.value == "PASSED"
        and oracle.get(t.workload.uuid)
    ]
    assert timed
    for e, ms in ((e, e.correctness.extra["oracle_latency_ms"]) for e in timed):
        assert ms > 0 and e.performance.reference_latency_ms == ms
        assert e.performance.speedup_factor == pytest.approx(ms / e.performance.latency_ms)
        assert NO_ORACLE not in e.log
    _, traces = undumped[BUILDS.name]
    passed = [t.evaluation for ts in traces.traces.values() for t in ts]
    passed = [e for e in passed if e.status.value == "PASSED"]
    assert passed
    for e in passed:
        assert e.performance.reference_latency_ms == 0 and e.performance.speedup_factor == 0
        assert NO_ORACLE in e.log and e.correctness.extra["oracle_latency_ms"] is None


def test_exported_torch_solutions_run_on_the_cpu_as_the_reference(smoke):
    """Every dumped workload through its definition's reference and the `torch` solution's
    main.py::run on the CPU: the same answer, in the shapes and dtypes the definition says,
    and the oracle's answer for the row's own case."""
    import safetensors.torch
    import torch
    from flashinfer_bench.data import TraceSet

    from dsv4bench.cases.inputs import make_inputs
    from dsv4bench.cases.oracle import oracle_call
    from dsv4bench.interop.flashinfer_bench.adapter import their_outputs

    run, out = smoke
    traces, cases = TraceSet.from_path(str(out)), _cases(run)
    checked = set()
    for name, definition in traces.definitions.items():
        solution = next(s for s in traces.solutions[name] if s.name.startswith("dsv4bench_torch__"))
        w = traces.workloads[name][0].workload
        blob = safetensors.torch.load_file(str(out / next(iter(w.inputs.values())).path))
        args = [blob[k] for k in definition.inputs]
        ref, sol = _run(definition.reference, args), _run(solution.sources[0].content, args)
        case = cases[w.uuid]
        oracle = their_outputs(case, oracle_call(case, make_inputs(case, "cpu"))(), blob)
        shapes = definition.get_output_shapes(definition.get_axes_values_from_inputs(args))
        for got, want, mine, shape, spec in zip(
            sol, ref, oracle, shapes, definition.outputs.values(), strict=True
        ):
            assert tuple(got.shape) == tuple(shape) and got.device.type == "cpu", name
            assert str(got.dtype) == f"torch.{spec.dtype.value}", name
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
            torch.testing.assert_close(want, mine, equal_nan=True, rtol=0, atol=0)
        checked.add(case.op)
    assert checked == {"decode", "prefill", "indexer", "topk", "dequant", "remap", "page_split"}


def _run(source: str, args: list):
    scope: dict = {}
    exec(source, scope)
    return scope["run"](*args)


def test_a_solution_runs_its_backend_on_the_inputs_device(smoke, monkeypatch):
    """adapter.solution hands the backend the device its inputs are on (a kernel's, on a GPU)."""
    import safetensors.torch
    from flashinfer_bench.data import TraceSet

    from dsv4bench import backends

    run, out = smoke
    traces = TraceSet.from_path(str(out))
    name = next(n for n in traces.definitions if n.startswith("dsv4bench_decode_v3p2"))
    w = traces.workloads[name][0].workload
    blob = safetensors.torch.load_file(str(out / next(iter(w.inputs.values())).path))
    solution = next(s for s in traces.solutions[name] if s.name.startswith("dsv4bench_torch__"))
    real, devices = backends.get, []

    class Recording:
        def prepare(self, case, inputs, device):
            devices.append(device)
            return real("torch").prepare(case, inputs, device)

    monkeypatch.setattr(backends, "get", lambda name: Recording())
    _run(solution.sources[0].content, [blob[k] for k in traces.definitions[name].inputs])
    assert devices == ["cpu"]
