"""Workloads (issue 23): ragged batches and index patterns, checked on the CPU: the oracle
against the independent float64 backend (ragged offsets included), the patterns' properties,
the new params' serialization and the scenario errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dsv4bench import backends, scenarios
from dsv4bench.cases import inputs, lengths, patterns
from dsv4bench.cases.case import Case
from dsv4bench.run import worker

TOY = """
name: toy-workloads
backends: [reference-f64, torch]
defaults: {num_heads: 8, page_size: 64}
cases:
  - {op: decode, model: v3.2, topk: 64, context_lens: {lengths: [300, 40, 129]}}
  - {op: decode, model: v3.2, topk: 64, s_q: 2, context_lens: {lengths: [70, 512]},
     index_pattern: [recent, clustered, sorted, indexer-topic]}
  - {op: decode, model: v4-flash, extra_topk: 64, context_lens: {lengths: [600, 100, 300]}}
  - {op: decode, model: v4-flash, compress_ratio: 128, context_lens: {lengths: [1024, 256, 700]}}
  - {op: decode, model: v4-flash, extra_topk: 64,
     context_lens: {dist: lognormal, mean: 512, batch: 3, sigma: 0.8, seed: 2, multiple: 64},
     index_pattern: indexer-recency}
  - {op: prefill, model: v4-flash, tokens: 16, extra_topk: 64,
     context_lens: {lengths: [400, 160, 700]}}
  - {op: prefill, model: v3.2, tokens: 8, topk: 64, context_lens: {lengths: [64, 300]},
     index_pattern: clustered}
"""


@pytest.fixture(scope="module")
def toy():
    backends.setup([])
    return scenarios.load_text(TOY, "toy.yaml", known_backends=backends.names())


def test_the_toy_file_expands_to_ragged_cases(toy):
    assert len(toy.cases) == 10
    first = toy.cases[0]
    assert first.batch_size == 3 and first.context_len == 300 and first.ragged == "list"
    assert all(c.context_lens for c in toy.cases)


def test_oracle_agrees_with_the_independent_float64_backend(toy):
    torch.set_num_threads(1)
    for case in toy.cases:
        row, _ = worker.check(case, backends.get("reference-f64"), "cpu", worker.Cache())
        assert row["status"] == "ok", (case.case_id, row["message"])
        assert row["accuracy"]["cos_diff"] <= case.tolerance.cos_diff


def test_ragged_prefill_oracle_catches_a_wrong_offset(toy):
    """The oracle reads request-relative indices; the kernel's indices carry the offsets. A
    batch whose offsets are off by one request disagrees with it."""
    from dsv4bench.cases.oracle import oracle_call
    from dsv4bench.measure import metrics
    from reference import indices

    case = next(c for c in toy.cases if c.op == "prefill" and c.model == "v4-flash")
    x = inputs.make_inputs(case, "cpu")
    right = oracle_call(case, x)()
    cu = x["cu_seqlens_k"]
    req = torch.arange(len(case.context_lens)).repeat_interleave(case.tokens)
    again = indices.ragged_to_global(x["ragged_indices"][:, 0], cu[:-1], req)
    assert torch.equal(again, x["indices"][:, 0])  # the kernel's indices are the offset ones
    wrong = dict(
        x,
        indices=indices.ragged_to_global(x["ragged_indices"][:, 0], cu[:-1], req.flip(0))[:, None],
    )
    f64 = backends.get("reference-f64")
    ok = f64.prepare(case, x, "cpu")
    bad = f64.prepare(case, wrong, "cpu")
    good = metrics.accuracy(right, ok.finish(ok.run()))
    off = metrics.accuracy(right, bad.finish(bad.run()))
    assert good["cos_diff"] <= case.tolerance.cos_diff < off["cos_diff"]


def test_ragged_decode_lengths_are_per_request(toy):
    case = next(c for c in toy.cases if c.context_lens == (600, 100, 300))  # V4-Flash C4
    x = inputs.make_inputs(case, "cpu")
    assert x["topk_length"].tolist() == [128, 100, 128]
    assert x["extra_topk_length"].tolist() == [64, 25, 64]
    valid = (x["extra_indices"][:, 0] >= 0).sum(-1)
    assert valid.tolist() == [64, 25, 64]
    v32 = inputs.make_inputs(toy.cases[0], "cpu")  # V3.2: -1 padding, no counts (sm90)
    assert "topk_length" not in v32 and (v32["indices"][1, 0] >= 0).sum() == 40


def test_ragged_topk_length_counts_each_requests_last_query():
    """With MTP (s_q 2) a request's last query sees one key more than its first: the count
    engines hand FlashMLA is the last query's, or that key is never read."""
    case = Case(scenario="t", op="decode", model="v4-flash", d_qk=512, d_v=512, num_heads=8,
                layout="v4", topk=128, page_size=64, s_q=2, batch_size=3, context_len=600,
                context_lens=(600, 100, 40), ragged="list")  # fmt: skip
    x = inputs.make_inputs(case, "cpu")
    valid = (x["indices"] >= 0).sum(-1)  # (b, s_q)
    assert valid[:, 0].tolist() != valid[:, 1].tolist()  # the two queries differ
    assert x["topk_length"].tolist() == valid[:, 1].tolist() == [128, 100, 40]


def _picks(pattern: str, visible: int = 8192, k: int = 256, rows: int = 8):
    g = torch.Generator().manual_seed(7)
    return patterns.choose(torch.full((rows,), visible), k, g, pattern)


@pytest.mark.parametrize("pattern", patterns.PATTERNS)
def test_every_pattern_picks_distinct_visible_positions_valid_first(pattern):
    g = torch.Generator().manual_seed(1)
    visible = torch.tensor([5000, 100, 3000, 1])
    x = patterns.choose(visible, 128, g, pattern, torch.tensor([0, 1, 1, 2]))
    for row, v in zip(x.tolist(), visible.tolist(), strict=True):
        got = [p for p in row if p >= 0]
        assert len(got) == min(128, v) == len(set(got))
        assert all(0 <= p < v for p in got) and row[: len(got)] == got


def test_recent_and_indexer_recency_pick_nearer_the_end_than_uniform():
    def distance(pattern):
        return float((8191 - _picks(pattern)).float().mean())

    uniform = distance("uniform")
    assert distance("recent") < uniform / 2
    assert distance("indexer-recency") < uniform / 2


def test_clustered_and_indexer_topic_picks_come_in_runs():
    adjacent = {p: patterns.locality(_picks(p), 64)["adjacent"] for p in patterns.PATTERNS}
    assert adjacent["clustered"] > 0.9 and adjacent["indexer-topic"] > 0.3
    assert adjacent["uniform"] < 0.1
    pages = {p: patterns.locality(_picks(p), 64)["pages_per_row"] for p in ("uniform", "clustered")}
    assert pages["clustered"] < pages["uniform"] / 3


def test_sorted_is_uniform_in_ascending_order():
    x = _picks("sorted")
    assert torch.equal(x, x.sort(dim=1).values)
    assert patterns.locality(x, 64)["adjacent"] < 0.1


def test_locality_counts_pages_and_neighbours():
    slots = torch.tensor([[0, 1, 2, 64, -1], [5, 200, 7, -1, -1]])
    loc = patterns.locality(slots, 64)
    assert loc == {"picks_per_row": 3.5, "pages_per_row": 2.0, "adjacent": round(2 / 7, 4)}


def test_lognormal_lengths_sum_to_the_uniform_batch_and_are_reproducible():
    a = lengths.lognormal(65536, 1.0, 16, seed=3, multiple=128)
    assert a == lengths.lognormal(65536, 1.0, 16, seed=3, multiple=128)
    assert sum(a.lengths) == 16 * 65536 and all(n % 128 == 0 and n > 0 for n in a.lengths)
    assert len(set(a.lengths)) > 8 and a.label == "lognormal(mean=65536,sigma=1,seed=3)"
    assert lengths.one_long(1 << 20, 4096, 4).lengths == (1 << 20, 4096, 4096, 4096)


def test_lognormal_lengths_spread_as_sigma_says():
    flat = lengths.lognormal(4096, 0.0, 64, seed=1)
    assert set(flat.lengths) == {4096}  # sigma 0: every request at the mean
    spread = {}
    for sigma in (0.25, 1.5):
        logs = [math.log(n) for n in lengths.lognormal(1 << 20, sigma, 400, seed=1).lengths]
        mean = sum(logs) / len(logs)
        spread[sigma] = math.sqrt(sum((v - mean) ** 2 for v in logs) / len(logs))
    assert spread[0.25] == pytest.approx(0.25, rel=0.15)
    assert spread[1.5] == pytest.approx(1.5, rel=0.15)


def test_new_params_serialize_and_old_ids_stay(toy):
    case = toy.cases[1]  # the first pattern of the second entry
    back = Case.from_dict(json.loads(json.dumps(case.to_dict())))
    assert back == case and back.case_id == case.case_id
    assert case.params()["context_lens"] == [70, 512] and case.params()["index_pattern"] == "recent"
    plain = Case(scenario="s", op="decode", model="v3.2", d_qk=576, d_v=512, num_heads=128)
    assert not {"context_lens", "ragged", "index_pattern"} & set(plain.params())
    assert plain.case_id == "decode-v3.2-v32-h128-b1-k2048-beed1de383"  # as before issue 23


BAD = [
    ("context_lens: {lengths: [4096, -3]}", "context_lens.lengths[1]: expected a positive integer"),
    ("context_lens: {lengths: [4096, 9000]}\n    context_len: 8192", "exceeds context_len (8192)"),
    ("index_pattern: recnet", "unknown index pattern 'recnet'; did you mean recent?"),
    ("context_lens: {dist: gamma, mean: 4}", "unknown length distribution 'gamma'"),
    ("context_lens: {dist: lognormal, mean: 100, batch: 4, multiple: 64}", "multiple of 64"),
    ("context_lens: {lengths: [10, 20]}\n    batch_size: 3", "one length per request"),
]


@pytest.mark.parametrize(("entry", "message"), BAD)
def test_bad_workload_values_are_one_line_with_file_and_line(entry, message):
    text = f"name: bad\nop: decode\nmodel: v3.2\nbackends: [torch]\ncases:\n  - {entry}\n"
    with pytest.raises(scenarios.ScenarioError) as e:
        scenarios.load_text(text, "bad.yaml", known_backends={"torch"})
    assert str(e.value).startswith("bad.yaml:6: cases[0].") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_pattern_needs_a_drawn_set():
    text = "name: w\nop: decode\nmodel: v4-flash\nbackends: [torch]\ncases:\n"
    text += "  - {compress_ratio: 128, index_pattern: recent}\n"
    with pytest.raises(scenarios.ScenarioError, match=r"w.yaml:6: .*index_pattern: pattern recent"):
        scenarios.load_text(text, "w.yaml", known_backends={"torch"})


def test_bad_workload_file_exits_2_with_one_line(tmp_path, run_cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nop: decode\nmodel: v3.2\nbackends: [torch]\ncases:\n"
        "  - context_lens: {lengths: [64, -1]}\n"
    )
    code, _, err = run_cli("plan", bad)
    assert code == 2 and err.strip().count("\n") == 0 and f"{bad}:6:" in err


SERVING = """
op: serving
model: v4-flash
batch_sizes: [4]
contexts: [8192]
ragged:
  - {dist: one-long, long: 20480, short: 4096, batch: 4}
"""


def _serving(text: str, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return scenarios.load_serving(path, known_backends={"torch"}), path


def test_serving_plans_one_tpot_step_per_ragged_batch(tmp_path):
    from dsv4bench.serving.planning import plan

    spec, _ = _serving(SERVING, tmp_path)
    curves = plan(spec).curves
    ragged = [c for c in curves if "ragged" in c.curve_id]
    assert len(curves) == 2 and len(ragged) == 1
    (point,) = ragged[0].points
    assert (point.batch_size, point.context_len) == (4, 20480)
    cases = [plan(spec).case(p.case_id) for p in point.parts]
    assert len(cases) == 3  # window, C4 and C128 layers, each over the requests' own contexts
    assert all(c.context_lens == (20480, 4096, 4096, 4096) for c in cases)
    assert sum(cases[0].context_lens) == 4 * 8192  # the uniform point's total tokens


def test_serving_ragged_errors_name_file_line_and_key(tmp_path):
    bad = SERVING.replace("long: 20480", "long: -3")
    with pytest.raises(scenarios.ScenarioError) as e:
        _serving(bad, tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 's.yaml'}:7: ragged[0].long: expected a positive")
    with pytest.raises(scenarios.ScenarioError, match=r":7: ragged\[0\]\.dist: unknown length"):
        _serving(SERVING.replace("one-long", "zipf"), tmp_path)
    with pytest.raises(scenarios.ScenarioError, match=r":6: ragged: expected a non-empty list"):
        _serving(SERVING.replace("ragged:\n  - {dist", "ragged: []\nx:\n  - {dist"), tmp_path)


def test_the_report_section_reads_the_h100_rows(tmp_path):
    from pathlib import Path

    from dsv4bench.report.load import load_runs
    from dsv4bench.report.render import Report
    from dsv4bench.report.sections.workloads import workloads

    # the workloads section alone (the whole report's other sections and figures are
    # tests/report's): the same rows, the same section code, a quarter of the time
    run = Path(__file__).resolve().parents[2] / "results/sm90/studies/workloads"
    rep = Report(load_runs([run]), tmp_path, [run])
    workloads(rep)
    md = rep.doc.to_markdown()
    section = md[md.index("## Workloads") :]
    for heading in ("Time against index locality", "Ragged batches", "Long context"):
        assert f"### {heading}" in section
    assert (tmp_path / "workloads-locality.png").stat().st_size > 10_000
    assert (tmp_path / "workloads-long-context.png").stat().st_size > 10_000
    ragged = [line for line in section.splitlines() if "| 6656..139520 (sum 512K) |" in line]
    assert len(ragged) == 4 and all("| ok |" in line for line in ragged)  # one per backend
    assert "indexer-topic" in section and "1024K" in section


def test_the_report_leaves_the_section_out_without_workload_rows(tmp_path):
    from dsv4bench.report.render import Report

    rep = Report([], tmp_path, [])
    from dsv4bench.report.sections.workloads import workloads

    workloads(rep)
    assert rep.left_out and rep.left_out[0].startswith("Workloads:")


GPU_TOY = TOY.replace(
    "backends: [reference-f64, torch]", "backends: [flashmla, triton, flashinfer]"
)
GPU_TOY = GPU_TOY.replace("num_heads: 8, page_size: 64", "num_heads: 64")
GPU_TOY = GPU_TOY.replace("topk: 64, ", "topk: 128, ").replace("extra_topk: 64", "extra_topk: 128")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flashmla", "triton", "flashinfer"])
def test_ragged_and_patterned_cases_run_ok_on_each_gpu_backend(backend):
    """Every attention backend reads the ragged lengths and offsets as the oracle does."""
    backends.setup([])
    sc = scenarios.load_text(GPU_TOY, "gpu-toy.yaml", known_backends=backends.names())
    cache = worker.Cache()
    seen = 0
    for case in sc.cases:
        row, _ = worker.check(case, backends.get(backend), "sm90", cache)
        if row["status"] == "unsupported":
            print(backend, case.case_id, row["message"])
            continue
        assert row["status"] == "ok", (backend, case.case_id, row["message"])
        assert row["info"]["memory"]["peak_mib"] >= row["info"]["memory"]["inputs_mib"] > 0
        seen += 1
    assert seen >= 5


def test_a_ragged_request_alone_keeps_its_own_length(toy):
    from dsv4bench.measure import invariance

    case = next(c for c in toy.cases if c.context_lens == (600, 100, 300))
    x = inputs.make_inputs(case, "cpu")
    alone, sub = invariance.single_request(case, x, 1)
    assert (alone.batch_size, alone.context_lens) == (1, (100,))
    assert sub["extra_topk_length"].tolist() == [25] and sub["q"].shape[0] == 1
    row = invariance.batch_invariance(backends.get("torch"), case, x, _oracle(case, x), "cpu")
    assert row["max_abs"] == 0.0  # the oracle answers each request alone as in the batch


def _oracle(case, x):
    from dsv4bench.cases.oracle import oracle_call

    return oracle_call(case, x)()


def test_the_ragged_ratio_is_ragged_time_over_uniform_time_within_one_run(tmp_path):
    """`ragged / uniform` above 1 says the ragged batch is slower; a twin of another run is no
    twin; the time is the winners' timer (makespan where both rows have it), events beside."""
    from dsv4bench.report.render import Report
    from dsv4bench.report.sections.workloads import workloads

    base = {"kind": "case", "op": "decode", "status": "ok", "backend": "flashmla"}
    p = {"op": "decode", "model": "v4-flash", "batch_size": 2, "s_q": 1, "compress_ratio": 4}
    ragged = {**base, "case_id": "r", "_run": "a", "params": {**p, "context_lens": [1000, 3000],
              "ragged": "list", "context_len": 3000},
              "timing": {"median_ms": 0.030, "profiler_ms": 0.026}}  # fmt: skip
    twin = {**base, "case_id": "u", "_run": "a", "params": {**p, "context_len": 2000},
            "timing": {"median_ms": 0.020, "profiler_ms": 0.013}}  # fmt: skip
    other = {**twin, "_run": "b", "timing": {"median_ms": 0.060}}
    rep = Report([other, ragged, twin], tmp_path, [])
    workloads(rep)
    md = rep.doc.to_markdown()
    assert "| ragged / uniform | events ragged / uniform |" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| decode v4-flash C4 b2 | list"))
    assert line.endswith("| 0.026 | 0.013 | profiler makespan | 2.00 | 1.50 |"), line
    rep = Report([other, ragged], tmp_path, [])  # the only uniform row is another run's
    workloads(rep)
    line = next(ln for ln in rep.doc.to_markdown().splitlines() if "| list |" in ln)
    assert line.endswith("| 0.026 |  | profiler makespan |  |  |"), line


def test_ragged_tpot_divides_points_of_one_timer_with_the_events_ratio_beside(tmp_path):
    """A ragged TPOT point over its uniform twin: by their shared timer, the events sums'
    ratio beside; points of two timers get no ratio of the two (`differ`), events still."""
    from dsv4bench.report.render import Report
    from dsv4bench.report.sections.workloads import workloads

    p = {"op": "decode", "model": "v4-flash", "batch_size": 2, "s_q": 1, "compress_ratio": 4}
    case = dict(kind="case", case_id="r", backend="flashmla", status="ok", _run="a")
    case["params"] = {**p, "context_lens": [1000, 3000], "ragged": "list"}
    point = dict(kind="serving", metric="tpot", model="v4-flash", backend="flashmla", _run="a")
    point.update(batch_size=2, status="ok", timer="profiler makespan")
    step = {**point, "curve_id": "tpot-ragged", "value_ms": 3.0, "events_ms": 4.2}
    step["parts"] = [{"case_id": "r"}]
    twin = {**point, "curve_id": "tpot", "context_len": 2000, "value_ms": 2.0, "events_ms": 3.0}

    def line(*rows):
        rep = Report([case, *rows], tmp_path, [])
        workloads(rep)
        md = rep.doc.to_markdown()
        assert "| timer | ragged / uniform | events ragged / uniform |" in md
        return next(ln for ln in md.splitlines() if ln.startswith("| v4-flash | list |"))

    assert line(step, twin).endswith("| 3 | 2 | profiler makespan | 1.50 | 1.40 |")
    old = {**twin, "timer": None, "events_ms": None, "value_ms": 4.0}  # an older events row
    assert line(step, old).endswith("| 3 | 4 | differ |  | 1.05 |")
