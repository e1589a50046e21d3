"""The support envelope: plan verdicts, rows filling cells, the grid picture, the table."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from dsv4bench.cases.case import Case
from dsv4bench.cli import main
from dsv4bench.report import capabilities, envelope
from dsv4bench.report.plots import envelope as plot

SCENARIO = """name: envelope-test
arch: [sm90]
backends: [torch, reference-f64]
timing: {warmup: 0, iters: 1}
defaults: {batch_size: 1}
cases:
  - {op: decode, model: v3.2, context_len: 512, num_heads: [8, 16], topk: [64, 192], s_q: [1, 8]}
  - {op: prefill, model: v4-flash, context_len: 1024, tokens: 16, compress_ratio: 4,
     num_heads: 8, extra_topk: [192, 256]}
"""


def _case(**kw) -> Case:
    base = dict(scenario="t", op="decode", model="v3.2", d_qk=576, d_v=512, num_heads=16)
    return Case(**{**base, **kw})


def test_cells_take_the_plan_then_the_rows():
    jobs = [
        SimpleNamespace(case=_case(topk=64), backend="a"),
        SimpleNamespace(case=_case(topk=128), backend="a"),
        SimpleNamespace(case=_case(topk=192), backend="a"),
        SimpleNamespace(case=_case(topk=256), backend="a"),
    ]
    ids = [j.case.case_id for j in jobs]
    rows = [
        {"case_id": ids[1], "backend": "a", "status": "timeout", "message": "120 s"},
        {"case_id": ids[2], "backend": "a", "status": "incorrect", "message": "cos_diff 0.3"},
        {"case_id": ids[3], "backend": "a", "status": "ok"},
    ]
    cells = envelope.cells(jobs, "sm90", lambda job: "no 64" if job.case.topk == 64 else None, rows)
    assert [(c.topk, c.status, c.reason) for c in cells] == [
        (64, "unsupported", "no 64"),
        (128, "crash", "timeout: 120 s"),
        (192, "incorrect", "cos_diff 0.3"),
        (256, "ok", ""),
    ]
    assert envelope.counts(cells)["a"]["crash"] == 1
    with pytest.raises(ValueError, match="unknown status"):
        envelope.row_status({"case_id": "x", "status": "weird"})


def test_a_resumed_job_fills_its_cell_with_its_last_row():
    job = SimpleNamespace(case=_case(topk=128), backend="a")
    first = {"case_id": job.case.case_id, "backend": "a", "status": "crash", "message": "killed"}
    last = {"case_id": job.case.case_id, "backend": "a", "status": "ok"}
    (cell,) = envelope.cells([job], "sm90", lambda job: None, [first, last])
    assert (cell.status, cell.reason) == ("ok", "")
    (cell,) = envelope.cells([job], "sm90", lambda job: None, [last, first])
    assert cell.status == "crash" and "killed" in cell.reason


def test_the_topk_axis_is_the_compressed_cache_width_where_there_is_one():
    v4 = _case(
        model="v4-flash",
        d_qk=512,
        layout="v4",
        topk=128,
        window=128,
        compress_ratio=4,
        extra_topk=1152,
    )
    assert envelope.indexer_width(v4) == 1152
    assert envelope.indexer_width(_case(topk=2048)) == 2048


def test_raw_heads_are_a_grid_of_their_own(tmp_path):
    jobs = [
        SimpleNamespace(case=_case(num_heads=8, head_padding=pad), backend="a")
        for pad in ("engine", "raw")
    ]
    assert jobs[0].case.case_id != jobs[1].case.case_id
    rows = [{"case_id": jobs[1].case.case_id, "backend": "a", "status": "error", "message": "h"}]
    cells = envelope.cells(jobs, "sm90", lambda job: None, rows)
    # the kernel's own check raised, the worker answered: refused, not a crash
    assert [(c.head_padding, c.status) for c in cells] == [
        ("engine", "planned"),
        ("raw", "refused"),
    ]
    assert [envelope.grid(c) for c in cells] == ["a", "a (heads raw)"]
    assert envelope.counts(cells) == {
        "a": {**dict.fromkeys(envelope.ENVELOPE_STATUSES, 0), "planned": 1},
        "a (heads raw)": {**dict.fromkeys(envelope.ENVELOPE_STATUSES, 0), "refused": 1},
    }
    envelope.write_cells(cells, tmp_path / "e.jsonl")
    assert envelope.read_cells(tmp_path / "e.jsonl") == cells
    # a file written before the axis: every cell the engine's padding
    old = json.dumps({k: v for k, v in vars(cells[0]).items() if k != "head_padding"})
    (tmp_path / "old.jsonl").write_text(old + "\n")
    assert envelope.read_cells(tmp_path / "old.jsonl")[0].head_padding == "engine"
    seen = []
    monkey = plot._panel
    try:
        plot._panel = lambda ax, mine, title: seen.append(title) or monkey(ax, mine, title)
        plot.draw(cells, tmp_path / "grid.png")
    finally:
        plot._panel = monkey
    assert seen == ["a: decode, v32", "a (heads raw): decode, v32"]


def test_the_shipped_envelope_lets_kernels_meet_the_heads_engines_pad():
    from pathlib import Path

    from dsv4bench import backends, scenarios

    path = Path(__file__).parents[2] / "scenarios/envelope/sm90.yaml"
    sc = scenarios.load(path, known_backends=backends.catalog())
    raw = [(c, b) for c, b in sc.jobs() if c.head_padding == "raw"]
    assert len(sc.jobs()) == 3960 and len(raw) == 810  # 3150 cells, and 1.26x with raw heads
    assert {b for _, b in raw} == {"flashmla", "q8kv8", "sglang-triton"}
    assert {c.num_heads for c, _ in raw} == {8, 16, 32}  # 64, 128: what every engine pads to
    # FlashMLA takes 64/128 heads: padded by the engine, refused unpadded, met raw
    case = next(c for c, b in raw if b == "flashmla" and c.num_heads == 8)
    fm = backends.get("flashmla")
    assert fm.supports(dataclasses.replace(case, head_padding="engine"), "sm90") is None
    assert "head_padding none" in fm.supports(
        dataclasses.replace(case, head_padding="none"), "sm90"
    )
    assert fm.supports(case, "sm90") is None


def test_plot_file_is_written(tmp_path):
    cells = [
        envelope.Cell("a", "sm90", "decode", "v32", h, k, s, status)
        for h, k, s, status in [(8, 64, 1, "ok"), (16, 64, 2, "crash"), (8, 128, 1, "planned")]
    ]
    path = plot.draw(cells, tmp_path / "grid.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no envelope cells"):
        plot.draw([], tmp_path / "none.png")


def test_the_command_writes_rows_plot_and_table_on_the_cpu(tmp_path, capsys):
    scenario = tmp_path / "env.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["envelope", str(scenario), "--arch", "sm90", "--out", str(out)]) == 0
    cells = envelope.read_cells(out / "envelope.jsonl")
    assert len(cells) == 2 * (8 + 2)  # two backends x (8 decode + 2 prefill cells)
    f64 = {c.status for c in cells if c.backend == "reference-f64"}
    torch_cells = [c for c in cells if c.backend == "torch"]
    assert f64 == {"unsupported"} and all(c.reason for c in cells if c.status == "unsupported")
    assert {c.status for c in torch_cells} == {"planned"}
    assert {(c.phase, c.layout) for c in torch_cells} == {("decode", "v32"), ("prefill", "v4")}
    assert {c.topk for c in torch_cells if c.phase == "prefill"} == {192, 256}
    assert (out / "envelope.png").stat().st_size > 0
    table = (out / "capabilities.md").read_text()
    assert "| torch | any | yes | yes |" in table
    assert "torch: 10 planned" in capsys.readouterr().out
    # a run's rows fill the cells
    run = tmp_path / "run"
    run.mkdir()
    first = torch_cells[0]
    row = {
        "kind": "case",
        "case_id": first.case_id,
        "backend": "torch",
        "status": "crash",
        "message": "boom",
    }
    (run / "results.jsonl").write_text(json.dumps(row) + "\n")
    assert (
        main(["envelope", str(scenario), "--arch", "sm90", "--out", str(out), "--rows", str(run)])
        == 0
    )
    again = {c.case_id + c.backend: c for c in envelope.read_cells(out / "envelope.jsonl")}
    assert again[first.case_id + "torch"].status == "crash"


def test_capability_table_reads_declared_facts():
    class Fake:
        layouts = ("v4",)
        capabilities = {"lse out": "yes", "CUDA graphs": "decode only"}

        def supports(self, case, arch):
            return "no sink" if case.sink else None

        def limit_guess(self, case, axis, arch):
            return 4096

    probe = _case(
        model="v4-flash",
        d_qk=512,
        layout="v4",
        topk=128,
        window=128,
        compress_ratio=4,
        extra_topk=512,
        sink=True,
    )
    row = capabilities.capability_row(Fake(), probe, "sm90")
    assert row["sink"] == "no" and row["extra cache"] == "yes"
    assert row["lse out"] == "yes (declared)"
    assert row["batch invariance"] == capabilities.NOT_DECLARED
    assert row["max rows"] == "4096" and row["FP8 layouts"] == "v4"
    assert capabilities.table({"fake": row}).count("\n") == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["envelope", "nope.yaml", "--arch", "sm90", "--out", "x"], "nope.yaml"),
        (["envelope", "SCEN", "--arch", "sm91", "--out", "x"], "invalid choice"),
        (
            ["envelope", "SCEN", "--arch", "sm90", "--out", "x", "--rows", "missing"],
            "no results.jsonl",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    scenario = tmp_path / "env.yaml"
    scenario.write_text(SCENARIO)
    argv = [str(scenario) if a == "SCEN" else a for a in argv]
    argv = [str(tmp_path / a) if a in ("x", "missing") else a for a in argv]
    with pytest.raises(SystemExit) if "sm91" in argv else _noop():
        code = main(argv)
    err = capsys.readouterr().err.strip()
    if "sm91" not in argv:
        assert code == 2
    assert message in err and len(err.splitlines()) == 1


class _noop:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
