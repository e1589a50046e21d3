"""flashinfer-bench interop: an export of a committed sm90 run loads in their data classes with
every row as a trace; their DSA definitions import as a scenario that runs on the CPU oracle;
bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench import cli
from dsv4bench.rows.results import read_rows

pytest.importorskip("flashinfer_bench.data", reason="flashinfer-bench (make install) is absent")

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results/sm90/studies/builds/flashinfer"  # ok, unsupported, error, incorrect, crash
FIXTURES = ROOT / "tests/fixtures/flashinfer_bench"  # the two published DSA definitions
STATUS = {
    "ok": "PASSED",
    "incorrect": "INCORRECT_NUMERICAL",
    "crash": "RUNTIME_ERROR",
    "error": "RUNTIME_ERROR",
    "unsupported": "COMPILE_ERROR",
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fib")
    assert (
        cli.main(["export", "flashinfer-bench", str(RUN), "--out", str(out), "--max-dump-mib", "0"])
        == 0
    )
    return out


def test_export_of_a_committed_run_loads_with_every_row_as_a_trace(exported):
    from flashinfer_bench.data import TraceSet

    traces = TraceSet.from_path(str(exported))
    rows = read_rows(RUN)
    got = {
        (t.workload.uuid, t.solution): t.evaluation.status.value
        for ts in traces.traces.values()
        for t in ts
    }
    assert len(got) == len(rows) == sum(len(ts) for ts in traces.traces.values())
    for row in rows:
        solution = next(s for (u, s) in got if u == row["case_id"] and f"_{row['backend']}__" in s)
        assert got[(row["case_id"], solution)] == STATUS[row["status"]]
        assert traces.get_solution(solution).definition in traces.definitions
    workloads = {t.workload.uuid for ts in traces.workloads.values() for t in ts}
    assert workloads == {r["case_id"] for r in rows}


def test_export_states_fp8_records_and_the_base_2_lse(exported):
    from flashinfer_bench.data import TraceSet

    traces = TraceSet.from_path(str(exported))
    decode = next(d for n, d in traces.definitions.items() if n.startswith("dsv4bench_decode_v4"))
    assert decode.inputs["k_cache"].dtype.value == "int8"
    assert decode.const_axes["record_bytes"] == 584
    assert decode.const_axes["page_stride_bytes"] >= 256 * 584
    assert "extra_k_cache" in decode.inputs and "attn_sink" in decode.inputs
    assert "base 2" in decode.outputs["lse"].description


def test_dumped_workload_reference_matches_the_oracle(tmp_path):
    """A small case's tensors go into safetensors; the definition's reference run on them gives
    the oracle's answer with lse in base 2."""
    import math

    import safetensors.torch
    import torch
    from flashinfer_bench.data import TraceSet

    from dsv4bench.cases.case import Case
    from dsv4bench.cases.inputs import make_inputs
    from dsv4bench.cases.oracle import oracle_call

    run = tmp_path / "run"
    assert cli.main(
        [
            "run",
            str(ROOT / "scenarios/smoke.yaml"),
            "--arch",
            "cpu",
            "--backend",
            "torch",
            "--out",
            str(run),
            "--quiet",
        ]
    ) in (0, 1)
    out = tmp_path / "fib"
    assert cli.main(["export", "flashinfer-bench", str(run), "--out", str(out)]) == 0
    traces = TraceSet.from_path(str(out))
    name, workloads = next((n, w) for n, w in traces.workloads.items() if "decode_v3p2" in n)
    w = workloads[0].workload
    blob = safetensors.torch.load_file(str(out / w.inputs["q"].path))
    scope: dict = {}
    exec(traces.definitions[name].reference, scope)
    args = [blob[k] for k in traces.definitions[name].inputs]
    output, lse = scope["run"](*args)
    row = next(
        json.loads(x)
        for x in (run / "results.jsonl").read_text().splitlines()
        if json.loads(x)["case_id"] == w.uuid
    )
    case = Case(scenario=row["scenario"], **row["params"])
    want = oracle_call(case, make_inputs(case, "cpu"))()
    torch.testing.assert_close(lse, want.lse.transpose(1, 2) / math.log(2.0))
    torch.testing.assert_close(output, want.out.to(torch.bfloat16))


def test_imported_dsa_definitions_run_on_the_cpu_oracle(tmp_path):
    scenario = tmp_path / "fib.yaml"
    assert cli.main(["import", "flashinfer-bench", str(FIXTURES), "--out", str(scenario)]) == 0
    run = tmp_path / "run"
    code = cli.main(
        ["run", str(scenario), "--arch", "cpu", "--backend", "torch", "--out", str(run), "--quiet"]
    )
    assert code == 0
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    assert {(r["op"], r["params"]["num_heads"], r["params"]["topk"]) for r in rows} == {
        ("decode", 16, 2048),
        ("indexer", 64, 2048),
    }
    assert {r["status"] for r in rows} == {"ok"}


@pytest.mark.parametrize(
    "argv, says",
    [
        (["export", "flashinfer-bench", "no/such/run", "--out", "x"], "no such run folder"),
        (["import", "flashinfer-bench", "no/such/dir"], "no such folder"),
    ],
)
def test_bad_paths_are_one_line_and_exit_2(argv, says, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_unknown_definition_op_is_one_line_and_exit_2(tmp_path, capsys):
    folder = tmp_path / "theirs" / "definitions"
    folder.mkdir(parents=True)
    data = json.loads(
        (
            FIXTURES / "definitions/dsa_paged/dsa_topk_indexer_fp8_h64_d128_topk2048_ps64.json"
        ).read_text()
    )
    data["name"] = "gemm_n128_k2048"
    (folder / "gemm.json").write_text(json.dumps(data))
    assert cli.main(["import", "flashinfer-bench", str(tmp_path / "theirs")]) == 2
    err = capsys.readouterr().err
    assert "gemm_n128_k2048: not a DSA definition" in err and err.count("\n") == 1


def test_import_out_never_overwrites_without_force(tmp_path, capsys):
    out = tmp_path / "fib.yaml"
    out.write_text("mine\n")
    argv = ["import", "flashinfer-bench", str(FIXTURES), "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "already exists; --force" in err and err.count("\n") == 1
    assert out.read_text() == "mine\n"
    assert cli.main([*argv, "--force"]) == 0
    assert "cases:" in out.read_text()


def test_import_out_is_never_a_file_of_the_input_folder(tmp_path, capsys):
    import shutil

    theirs = tmp_path / "theirs"
    shutil.copytree(FIXTURES, theirs)
    target = next((theirs / "definitions").rglob("*.json"))
    before = target.read_text()
    argv = ["import", "flashinfer-bench", str(theirs), "--out", str(target), "--force"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "is a file of the input folder" in err and err.count("\n") == 1
    assert target.read_text() == before


ATTN = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def _theirs(tmp_path: Path) -> Path:
    import shutil

    theirs = tmp_path / "theirs"
    shutil.copytree(FIXTURES, theirs)
    return theirs


def _set(record: dict, keys: str, value) -> None:
    """record[a][b]... = value for keys "a.b..."; value None deletes it."""
    *path, last = keys.split(".")
    for k in path:
        record = record[k]
    if value is None:
        del record[last]
    else:
        record[last] = value


DEF_ATTN, DEF_INDEXER = (f"definitions/dsa_paged/{n}.json" for n in (ATTN, INDEXER))
WORK_ATTN = f"workloads/dsa_paged/{ATTN}.jsonl"
REFUSED = [
    (DEF_ATTN, "axes.page_size.value", 0, f"{DEF_ATTN}: axes.page_size: 0, expected a positive"),
    (DEF_INDEXER, "axes.topk.value", 0, f"{DEF_INDEXER}: axes.topk: 0, expected a positive"),
    (WORK_ATTN, "workload.axes.num_tokens", 0, f"{WORK_ATTN}:1: workload.axes.num_tokens: 0"),
    (DEF_ATTN, "op_type", None, f"{DEF_ATTN}: op_type: Field required"),
    (WORK_ATTN, "workload.uuid", None, f"{WORK_ATTN}:1: workload.uuid: Field required"),
]


@pytest.mark.parametrize("file, keys, value, says", REFUSED)
def test_import_refuses_what_would_not_load_naming_file_and_field(
    tmp_path, capsys, file, keys, value, says
):
    theirs = _theirs(tmp_path)
    path = theirs / file
    if file.endswith(".jsonl"):  # the first workload of the file
        lines = path.read_text().splitlines()
        record = json.loads(lines[0])
        _set(record, keys, value)
        path.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    else:
        record = json.loads(path.read_text())
        _set(record, keys, value)
        path.write_text(json.dumps(record))
    out = tmp_path / "s.yaml"
    assert cli.main(["import", "flashinfer-bench", str(theirs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not out.exists()


def test_import_of_a_non_utf8_definition_is_one_line(tmp_path, capsys):
    theirs = _theirs(tmp_path)
    (theirs / f"definitions/dsa_paged/{ATTN}.json").write_bytes(b'{"name": "\xff"}')
    assert cli.main(["import", "flashinfer-bench", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert f"{ATTN}.json: not UTF-8 text" in err and err.count("\n") == 1


@pytest.mark.parametrize("size", ["nan", "-5", "inf"])
def test_export_refuses_a_dump_size_that_is_not_one(tmp_path, capsys, size):
    argv = ["export", "flashinfer-bench", str(RUN), "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--max-dump-mib", size]) == 2
    err = capsys.readouterr().err
    assert f"--max-dump-mib {float(size)}: expected a size >= 0" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_export_into_a_folder_with_files_needs_force(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "mine.txt").write_text("keep\n")
    argv = ["export", "flashinfer-bench", str(RUN), "--out", str(out), "--max-dump-mib", "0"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "holds files already" in err and err.count("\n") == 1
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert cli.main([*argv, "--force"]) == 0
    assert (out / "mine.txt").read_text() == "keep\n" and (out / "definitions").is_dir()
