"""A run folder -> a flashinfer-bench TraceSet folder (their layout, data/trace_set.py):
  definitions/<op_type>/<definition>.json       one per set of constant case fields
  workloads/<op_type>/<definition>.jsonl        one workload per case (its uuid: the case id)
  blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors   its exact inputs
  solutions/<backend>/<definition>.json         a thin wrapper naming the backend and its build
  traces/<op_type>/<definition>.jsonl           one trace per row
Inputs are made again from each case's seed (dsv4bench/cases/inputs.py); a case whose tensors
pass `max_dump_mib` keeps its workload without them (inputs "random"), its axes computed from
its fields (dsv4bench/cases/input_shapes.py), so their harness can size it all the same.
Row status -> their EvaluationStatus: STATUS below."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections import defaultdict
from pathlib import Path

from dsv4bench.cases.case import Case
from dsv4bench.interop.flashinfer_bench import schema

# Row status -> their status. `unsupported` (the backend declines the case: no kernel or build
# for it) is closest to their COMPILE_ERROR (no runnable solution); the log says which it was.
STATUS = {
    "ok": "PASSED",
    "incorrect": "INCORRECT_NUMERICAL",
    "crash": "RUNTIME_ERROR",
    "error": "RUNTIME_ERROR",
    "oom": "RUNTIME_ERROR",
    "timeout": "TIMEOUT",
    "unsupported": "COMPILE_ERROR",
}
ORACLE = "torch"  # the backend whose rows time the oracle itself
RANDOM = {"type": "random"}  # a workload input their harness draws (a case not dumped)
NO_ORACLE = (
    f"no oracle timing: the run has no {ORACLE!r} row of this case, so reference_latency_ms and "
    "speedup_factor are 0 (absent)"
)


@dataclasses.dataclass
class Exported:
    definitions: int
    workloads: int
    dumped: int
    solutions: int
    traces: int


def export(run_dir: Path, out: Path, max_dump_mib: float = 256.0) -> Exported:
    from dsv4bench.report.load import load_rows

    # case rows and limit searches (each a trace of the case it stopped at); serving points
    # are sums of case rows, not kernel calls
    rows = [r for r in load_rows(run_dir) if r.get("kind", "case") in ("case", "limit")]
    if not rows:
        raise ValueError(f"{run_dir}: no case rows to export")
    cases = {r["case_id"]: Case(scenario=r["scenario"], **r["params"]) for r in rows}
    cases = {k: c for k, c in cases.items() if schema.exportable(c)}  # the rest: no form there
    rows = [r for r in rows if r["case_id"] in cases]
    groups: dict[str, list[str]] = defaultdict(list)
    for case_id, case in cases.items():
        groups[schema.definition_key(case)].append(case_id)
    stamp = _stamp(run_dir)
    oracle_ms = {r["case_id"]: _median(r) for r in rows if r["backend"] == ORACLE}
    counts = Exported(0, 0, 0, 0, 0)
    for ids in groups.values():
        definition = _write_definition(out, cases[ids[0]])
        name = definition.name
        workloads = {}
        for case_id in ids:
            workloads[case_id], dumped = _workload(out, name, case_id, cases[case_id], max_dump_mib)
            counts.dumped += dumped
        _write_jsonl(
            out / "workloads" / schema.OP_TYPE / f"{name}.jsonl",
            [_trace(name, w) for w in workloads.values()],
        )
        mine = [r for r in rows if r["case_id"] in workloads]
        solutions = {}
        for r in mine:
            if r["backend"] not in solutions:
                solutions[r["backend"]] = _write_solution(out, definition, cases[r["case_id"]], r)
        traces = [
            _trace(
                name,
                workloads[r["case_id"]],
                solutions[r["backend"]].name,
                _evaluation(r, oracle_ms.get(r["case_id"]), stamp),
            )
            for r in mine
        ]
        _write_jsonl(out / "traces" / schema.OP_TYPE / f"{name}.jsonl", traces)
        counts.definitions += 1
        counts.workloads += len(workloads)
        counts.solutions += len(solutions)
        counts.traces += len(traces)
    return counts


def _write_definition(out: Path, case: Case):
    from flashinfer_bench.data import Definition

    from dsv4bench.cases.inputs import make_inputs

    try:
        probe = make_inputs(schema.shrunk(case), "cpu")
    except (ValueError, RuntimeError):  # a shrunk size the case's fields forbid
        probe = make_inputs(case, "cpu")
    data = schema.definition(case, schema.shapes_of(probe), reference_text(case, probe))
    definition = Definition.model_validate(data)
    _write_json(out / "definitions" / schema.OP_TYPE / f"{definition.name}.json", definition)
    return definition


def reference_text(case: Case, inputs: dict) -> str:
    """Their `reference`: a `run` over the definition's inputs calling this suite's oracle."""
    return _wrapper(
        f"The dsv4bench oracle (reference/, pure PyTorch) for {schema.definition_name(case)}.",
        list(schema.shapes_of(inputs)),
        "from dsv4bench.interop.flashinfer_bench.adapter import reference\n"
        "    return reference(CASE, inputs)",
        case,
    )


def _wrapper(doc: str, names: list[str], body: str, case: Case) -> str:
    fixed = {k: v for k, v in case.params().items() if k not in schema.VARYING}
    args = ", ".join(names)
    packed = ", ".join(f"{n!r}: {n}" for n in names)
    return (
        f'"""{doc}\nNeeds the dsv4bench package (it ships reference/)."""\n\n'
        f"CASE_FIELDS = {fixed!r}\n\n\n"
        f"def run({args}, **variable):\n"
        "    # variable: case fields the inputs do not show (context_len, context_lens, seed);\n"
        "    # batch_size, s_q and tokens are read from the inputs (adapter.sizes_of)\n"
        "    CASE = {**CASE_FIELDS, **variable}\n"
        f"    inputs = {{{packed}}}\n"
        f"    {body}\n"
    )


def _workload(out: Path, name: str, case_id: str, case: Case, max_dump_mib: float):
    """Their Workload of one case, and whether its tensors were written."""
    from flashinfer_bench.data import Workload

    from dsv4bench.cases.input_shapes import input_shapes

    shapes = input_shapes(case)
    if sum(s.nbytes for s in shapes.values()) / 2**20 > max_dump_mib:
        axes = _variable_axes(case, {k: s.dims for k, s in shapes.items()})
        return Workload(uuid=case_id, axes=axes, inputs=dict.fromkeys(shapes, RANDOM)), False
    import safetensors.torch
    import torch

    from dsv4bench.cases.inputs import make_inputs

    inputs = {k: v for k, v in make_inputs(case, "cpu").items() if v is not None}
    blob = Path("blob") / "workloads" / schema.OP_TYPE / name / f"{name}_{case_id}.safetensors"
    (out / blob).parent.mkdir(parents=True, exist_ok=True)
    saved = {
        k: (v.view(torch.int8) if v.dtype == torch.uint8 else v).contiguous()
        for k, v in inputs.items()
    }
    safetensors.torch.save_file(saved, str(out / blob))
    axes = _variable_axes(case, {k: tuple(v.shape) for k, v in inputs.items()})
    spec = {k: {"type": "safetensors", "path": str(blob), "tensor_key": k} for k in saved}
    return Workload(uuid=case_id, axes=axes, inputs=spec), True


def _variable_axes(case: Case, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """The value of every variable axis of the inputs' dims."""
    axes = {}
    for key, dims in shapes.items():
        for axis, size in zip(schema.axis_names(case, key, len(dims)), dims, strict=True):
            if axis not in schema.CONSTANT:
                axes[axis] = size
    return axes


def _write_solution(out: Path, definition, case: Case, row: dict):
    from flashinfer_bench.data import Solution

    backend = row["backend"]
    provider = row.get("provider") or {}
    build = " ".join(str(provider.get(k)) for k in ("name", "version") if provider.get(k))
    options = row.get("backend_options") or {}
    doc = (
        f"dsv4bench backend adapter {backend!r} (dsv4bench/backends, base "
        f"{row.get('backend_base')!r}); build: {build or 'none recorded'}; options: {options}"
    )
    names = list(definition.inputs)
    source = _wrapper(
        doc,
        names,
        "from dsv4bench.interop.flashinfer_bench.adapter import solution\n"
        f"    return solution({backend!r}, CASE, inputs)",
        case,
    )
    solution = Solution.model_validate(
        {
            "name": f"dsv4bench_{backend}__{definition.name}",
            "definition": definition.name,
            "author": "dsv4bench",
            "description": doc,
            "spec": {
                "language": "python",
                "target_hardware": [str((row.get("env") or {}).get("arch") or "cuda")],
                "entry_point": "main.py::run",
                "dependencies": ["dsv4bench", *([build] if build else [])],
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )
    _write_json(out / "solutions" / backend / f"{definition.name}.json", solution)
    return solution


def _evaluation(row: dict, oracle_ms: float | None, stamp: str):
    from flashinfer_bench.data import Correctness, Environment, Evaluation, Performance

    status = STATUS[row["status"]]
    env = row.get("env") or {}
    libs = {k: str(env[k]) for k in ("torch", "cuda", "triton", "driver") if env.get(k)}
    provider = row.get("provider") or {}
    if provider.get("version"):
        libs[str(provider.get("name"))] = str(provider["version"])
    log = f"dsv4bench status {row['status']}"
    log += f": {row['message']}" if row.get("message") else ""
    if row.get("kind") == "limit":
        search = {k: row.get(k) for k in ("axis", "last_ok", "first_fail", "probes")}
        log += f" (a limit search: {json.dumps(search)})"
    correctness = performance = None
    if status in ("PASSED", "INCORRECT_NUMERICAL"):
        acc = row.get("accuracy") or {}
        correctness = Correctness(
            max_absolute_error=acc.get("max_abs", float("nan")),
            max_relative_error=acc.get("max_rel", float("nan")),
            extra={
                "accuracy": acc or None,
                "tolerance": row.get("tolerance"),
                "oracle_latency_ms": oracle_ms,  # None: the run timed no oracle for the case
            },
        )
    if status == "PASSED":
        ms, ref = _median(row) or 0.0, oracle_ms or 0.0
        performance = Performance(
            latency_ms=ms, reference_latency_ms=ref, speedup_factor=ref / ms if ms and ref else 0
        )
        if not ref:  # their fields are numbers, 0.0 by default: the log says 0 is absent
            log += f"; {NO_ORACLE}"
    return Evaluation(
        status=status,
        environment=Environment(hardware=str(env.get("gpu") or env.get("arch") or "?"), libs=libs),
        timestamp=stamp,
        log=log,
        correctness=correctness,
        performance=performance,
    )


def _trace(name: str, workload, solution: str | None = None, evaluation=None):
    from flashinfer_bench.data import Trace

    return Trace(definition=name, workload=workload, solution=solution, evaluation=evaluation)


def _median(row: dict) -> float | None:
    return (row.get("timing") or {}).get("median_ms")


def _stamp(run_dir: Path) -> str:
    """When the rows were written (the rows carry no time of their own)."""
    from dsv4bench.rows.results import rows_file

    path = rows_file(run_dir) if run_dir.is_dir() else run_dir
    when = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    return when.isoformat(timespec="seconds")


def _write_json(path: Path, model) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.model_dump(mode="json"), indent=2) + "\n")


def _write_jsonl(path: Path, models: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(m.model_dump_json() + "\n" for m in models))
