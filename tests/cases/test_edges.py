"""The engines' failure shapes (Case.edge): the scenario grammar, the inputs each builds, the
padding the engines do, a run through the oracle on the CPU, and the engine-issue notes."""

from __future__ import annotations

import json

import pytest
import torch

from dsv4bench.cases import edges, engine_issues, inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.cli import main
from dsv4bench.scenarios import ScenarioError
from tests.factories import V4, V32, load_scenario, make_case

SCENARIO = """name: edges-test
arch: [cpu]
backends: [torch, reference-f64]
timing: {warmup: 0, iters: 1}
cases:
  - {op: prefill, model: v3.2, context_len: 512, tokens: 16, num_heads: 16, topk: 64,
     edge: empty-chunk}
  - {op: decode, model: v4-flash, context_len: 1024, num_heads: 16, batch_size: 3,
     edge: empty-request}
  - {op: decode, model: v4-flash, context_len: 1024, num_heads: 16, batch_size: 2,
     graph_batch: 4, edge: [graph-pad-vllm, graph-pad-sglang]}
"""
BACKENDS = ("torch", "reference-f64", "flashmla")


def _v4(**kw):
    return make_case(V4, topk=128, window=128, compress_ratio=4, extra_topk=64, sink=True,
                     context_len=1024, num_heads=16, page_size=256, **kw)  # fmt: skip


def test_the_shapes_expand_with_ids_of_their_own():
    s = load_scenario(SCENARIO, BACKENDS)
    got = [(c.op, c.edge, c.graph_batch) for c in s.cases]
    assert got == [
        ("prefill", "empty-chunk", 0),
        ("decode", "empty-request", 0),
        ("decode", "graph-pad-vllm", 4),
        ("decode", "graph-pad-sglang", 4),
    ]
    assert len({c.case_id for c in s.cases}) == 4
    plain = load_scenario(SCENARIO.replace("edge: empty-request", "s_q: 1"), BACKENDS).cases[1]
    assert "edge" not in plain.params() and "graph_batch" not in plain.params()


@pytest.mark.parametrize(
    "entry, message",
    [
        ("{op: decode, model: v3.2, edge: empty-chunk}", "empty-chunk is a prefill call"),
        ("{op: decode, model: v3.2, edge: empty-request}", "decode batch of 2 or more"),
        ("{op: decode, model: v3.2, batch_size: 4, graph_batch: 4, edge: graph-pad-vllm}",
         "graph_batch > batch_size"),
        ("{op: decode, model: v3.2, graph_batch: 4}",
         "captured batch of a graph-pad or graph-refill edge"),
        ("{op: decode, model: v3.2, edge: empty}", "failure shape"),
        ("{op: prefill, model: v3.2, route: decode-mixed, edge: empty-chunk}", "decode-mixed"),
    ],
)  # fmt: skip
def test_a_shape_that_does_not_fit_its_case_is_refused(entry, message):
    text = f"name: x\narch: [cpu]\nbackends: [torch]\ncases:\n  - {entry}\n"
    with pytest.raises(ScenarioError, match=message):
        load_scenario(text, BACKENDS)


def test_an_empty_chunk_keeps_the_workspace_and_loses_every_query_row():
    case = make_case(V32, op="prefill", tokens=16, topk=64, context_len=512, num_heads=16,
                     edge="empty-chunk")  # fmt: skip
    x = inputs.make_inputs(case, "cpu")
    assert x["q"].shape == (0, 16, 576) and x["indices"].shape[0] == 0
    assert x["kv"].shape[0] == 512 and x["topk_length"].shape == (0,)
    assert case.query_tokens == 0
    assert oracle_call(case, x)().out.shape == (0, 16, 512)


def test_an_empty_request_sits_inside_the_batch_with_no_index_and_counts_zero():
    case = _v4(batch_size=3, edge="empty-request")
    x = inputs.make_inputs(case, "cpu")
    assert (x["indices"][1] == -1).all() and (x["extra_indices"][1] == -1).all()
    assert x["topk_length"].tolist() == [128, 0, 128]
    assert x["extra_topk_length"].tolist() == [64, 0, 64]
    out = oracle_call(case, x)()
    assert (out.out[1] == 0).all() and torch.isinf(out.lse[1]).all()
    assert (out.out[0] != 0).any()


def test_vllm_pads_with_no_context_and_sglang_with_one_stale_slot():
    for edge, seq_len in (("graph-pad-vllm", 0), ("graph-pad-sglang", 1)):
        case = _v4(batch_size=2, graph_batch=5, edge=edge)
        x = inputs.make_inputs(case, "cpu")
        wide, y = edges.padded(case, x)
        assert wide.batch_size == 5 and wide.context_lens == (1024, 1024) + (seq_len,) * 3
        assert wide.edge == "" and wide.graph_batch == 0
        assert torch.equal(y["q"][:2], x["q"]) and (y["q"][2:] == 0).all()
        assert y["topk_length"].tolist() == [128, 128] + [seq_len] * 3
        assert y["extra_topk_length"].tolist() == [64, 64] + [seq_len] * 3
        pad = y["indices"][2:]
        assert (pad[..., 1:] == -1).all()
        live = x["indices"][0][x["indices"][0] >= 0]
        assert (pad[..., 0] == (live[0] if seq_len else -1)).all()
        assert edges.PADDING[edge].source  # where the engine does it
        # the real rows of the padded call are the real batch's answer
        full = edges.real_rows(oracle_call(wide, y)(), 2)
        alone = oracle_call(case, x)()
        assert torch.equal(full.out, alone.out) and torch.equal(full.lse, alone.lse)


def test_the_shapes_run_through_the_oracle_on_the_cpu(tmp_path):
    scenario = tmp_path / "edges.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok"] * 8
    padded = [r for r in rows if r["params"].get("graph_batch")]
    assert {r["info"]["graph_padding"]["engine"] for r in padded} == {"vllm", "sglang"}
    assert all(r["info"]["graph_padding"]["replay"].startswith("eager") for r in padded)
    notes = {r["params"]["edge"]: r["info"]["engine_issue"][0] for r in rows}
    assert notes["empty-chunk"]["issue"].startswith("vLLM issue 51486")
    assert notes["empty-chunk"]["build_has_fix"].startswith("no: the fix is in the engine")
    assert notes["graph-pad-vllm"]["build_has_fix"].startswith("unknown")
    # the oracle prints nothing and answers right: no symptom
    assert notes["empty-request"]["symptom_seen"].startswith("no: ")
    assert all("stderr" not in r["info"] for r in rows)


def test_a_symptom_is_seen_in_the_message_or_in_what_the_job_printed():
    chunk, request = (engine_issues.ISSUES[t] for t in ("vllm-51486", "vllm-56563"))
    flashmla = "RuntimeError: Assertion error (phase1.cuh:615): Assertion `res == CUresult::CUDA_SUCCESS` failed"  # noqa: E501
    assert engine_issues.symptom_seen(chunk, flashmla, "").startswith("yes: ")
    assert "the row's message" in engine_issues.symptom_seen(chunk, flashmla, "")
    fa3 = "TMA Desc Addr: 0x1\nError: Failed to initialize the TMA descriptor 1\n"
    assert "the job's stderr" in engine_issues.symptom_seen(request, "", fa3)
    assert engine_issues.symptom_seen(request, "", "a warning").startswith("no: ")
    assert "printed nothing" in engine_issues.symptom_seen(request, "", "")
    mute = engine_issues.EngineIssue("t", "issue", "symptom")
    assert engine_issues.symptom_seen(mute, fa3, fa3).startswith("unknown")


REFILL = """name: refill-test
arch: [cpu]
backends: [torch, copying, stale, reference-f64]
timing: {warmup: 0, iters: 1}
cases:
  - {op: decode, model: v4-flash, context_len: 1024, num_heads: 16, batch_size: 3,
     graph_batch: 5, edge: [graph-refill-vllm, graph-refill-sglang]}
  - {op: decode, model: v3.2, context_len: 512, num_heads: 16, topk: 64, batch_size: 2,
     s_q: 2, graph_batch: 4, edge: graph-refill-vllm}
"""


def test_the_other_batch_has_the_same_shapes_and_other_lengths_and_indices():
    case = _v4(batch_size=3, graph_batch=5, edge="graph-refill-vllm")
    x = inputs.make_inputs(case, "cpu")
    before_case, before = edges.other_batch(case, x)
    for k, v in x.items():
        if hasattr(v, "shape"):
            assert before[k].shape == v.shape and before[k].dtype == v.dtype, k
    assert torch.equal(before["q"][1], x["q"][0]) and not torch.equal(before["q"], x["q"])
    assert torch.equal(before["indices"][1:], x["indices"][:2])
    assert before["topk_length"].tolist() == [64, 128, 128]  # the first request's halved
    assert before["extra_topk_length"].tolist() == [32, 64, 64]
    assert before_case.context_lens == (512, 1024, 1024)
    # its answer differs from this batch's in every request: a stale buffer shows
    a, b = oracle_call(case, before)(), oracle_call(case, x)()
    assert all(not torch.allclose(a.out[r], b.out[r]) for r in range(3))


def test_refill_copies_in_place_and_refuses_buffers_that_follow_the_batch():
    from dsv4bench.backends.base import Unsupported
    from dsv4bench.run import padded

    static = (torch.zeros(2, 3), None, torch.zeros(4, dtype=torch.int32))
    where = [t.data_ptr() for t in static if t is not None]
    new = (torch.ones(2, 3), None, torch.arange(4, dtype=torch.int32))
    padded.refill(static, new)
    assert [t.data_ptr() for t in static if t is not None] == where
    assert (static[0] == 1).all() and static[2].tolist() == [0, 1, 2, 3]
    with pytest.raises(Unsupported, match=r"buffer 2 of the captured call is \(4,\) torch.int32, "
                       r"the next batch's \(5,\)"):  # fmt: skip
        padded.refill(static, (new[0], None, torch.arange(5, dtype=torch.int32)))
    with pytest.raises(Unsupported, match="has 2 buffers, the captured one 3"):
        padded.refill(static, new[:2])


def test_a_graph_refill_is_judged_on_the_batch_copied_in(tmp_path):
    scenario = tmp_path / "refill.yaml"
    scenario.write_text(REFILL)
    out = tmp_path / "run"
    main(["run", str(scenario), "--out", str(out), "--plugin", "tests.plugins.misbehaving"])
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    by = {}
    for r in rows:
        by.setdefault(r["backend"], []).append(r)
    assert [r["status"] for r in by["torch"]] == ["ok"] * 3
    assert [r["status"] for r in by["copying"]] == ["ok"] * 3
    # the indices of the captured batch left in place: the replay answers the other batch
    assert [r["status"] for r in by["stale"]] == ["incorrect"] * 3
    assert all("Prepared.buffers" in r["message"] for r in by["reference-f64"])
    assert {r["status"] for r in by["reference-f64"]} == {"unsupported"}
    info = by["copying"][0]["info"]
    assert info["graph_refill"]["refilled"].endswith("buffers copied in place (Prepared.buffers)")
    assert info["graph_padding"]["replay"].startswith("eager")
    assert by["copying"][0]["info"]["engine_issue"][0]["issue"].startswith("vLLM issues 56771")


def test_a_refilled_call_reads_and_models_the_batch_copied_in():
    """What a refilled row is judged on (the converted operands, the kernel's exact model) is
    the next batch's, copied in, never the captured batch's."""
    from dsv4bench.backends import Prepared
    from dsv4bench.run import padded
    from tests.plugins.misbehaving import Copying

    def copied(x: dict) -> dict:
        return {k: v.clone() if hasattr(v, "clone") else v for k, v in x.items()}

    class Converting(Copying):
        """Keeps what it converted for the judge apart from the buffers its call reads (as an
        adapter's dequantized copy of an FP8 cache is)."""

        def prepare(self, case, inputs, device):
            own, kept = copied(inputs), copied(inputs)
            keys = [k for k in sorted(own) if hasattr(own[k], "data_ptr")]
            return Prepared(
                run=oracle_call(case, own),
                buffers=tuple(own[k] for k in keys),
                reads=kept,
                exact=oracle_call(case, kept),
            )

    case = _v4(batch_size=3, graph_batch=5, edge="graph-refill-vllm")
    x = inputs.make_inputs(case, "cpu")
    prepared = padded.prepare(Converting(), case, x, "cpu", "cpu")
    assert torch.equal(prepared.reads["q"], x["q"])
    assert torch.equal(prepared.reads["indices"], x["indices"])
    want = oracle_call(case, x)().out
    assert torch.equal(prepared.exact().out, want)
    assert torch.equal(prepared.finish(prepared.run()).out, want)


def test_a_kernel_fix_is_read_against_the_build_version():
    fixed = engine_issues.EngineIssue(
        "t", "issue", "symptom", "PR 1", "kernel", {"flash_mla": "1.2.0"}
    )
    assert engine_issues.has_fix(fixed, "flash_mla", "1.2.1").startswith("yes")
    # the first fixed release itself has the fix; the one before does not
    assert engine_issues.has_fix(fixed, "flash_mla", "1.2.0").startswith("yes")
    assert engine_issues.has_fix(fixed, "flash_mla", "1.1.9").startswith("no")
    assert engine_issues.has_fix(fixed, "flash_mla", "sgl 1.0.0").startswith("no")
    assert engine_issues.has_fix(fixed, "other", "9.9").startswith("unknown")
    tagged = make_case(V32, tags=("vllm-52339",))
    assert [i.tag for i in engine_issues.issues_of(tagged)] == ["vllm-52339"]
    assert engine_issues.issues_of(make_case(V32)) == []


def test_the_prefill_context_limit_searches_plan_per_build():
    from pathlib import Path

    from dsv4bench import backends, scenarios
    from dsv4bench.backends.sglang_triton.backend import SglangTriton

    path = Path(__file__).parents[2] / "scenarios/failures/prefill_context_limit_sm90.yaml"
    sc = scenarios.load(path, known_backends=backends.catalog())
    assert [s.backend for s in sc.limits[:12]] == [
        "flashmla-vllm-0.26.0", "flashmla-vllm-0.33.0", "flashmla-sgl-1.0.0", "fa3-vllm-0.33.0",
        "flashmla-vllm-0.26.0", "flashmla-vllm-0.33.0", "flashmla-sgl-1.0.0", "fa3-vllm-0.33.0",
        "flashmla-sgl-1.0.0", "flashmla-vllm-0.26.0", "flashmla-vllm-0.33.0", "fa3-vllm-0.33.0",
    ]  # fmt: skip
    for s in sc.limits[:4]:
        assert (s.axis, s.lo, s.hi, s.step) == ("context_len", 131072, 262144, 16384)
    # the issue's 8192-token chunk from 128K to 1M, V4-Flash then V3.2 (whose kv is the whole
    # context), every search through the issue's 161K
    assert {(s.lo, s.hi, s.base.tokens) for s in sc.limits[4:]} == {(131072, 1048576, 8192)}
    assert all(s.probe == (164864,) for s in sc.limits)
    assert [s.base.model for s in sc.limits[8:12]] == ["v3.2"] * 4
    # every sm90 build that takes a prefill chunk has a search on each model it reads, on the
    # route it takes the chunk (sglang's V4 Triton decode: decode-kernel)
    searched = {(s.backend, s.base.model, s.base.route) for s in sc.limits}
    for build in (
        "fa3-vllm-0.26.0", "flashinfer-0.7.2.post1", "flashinfer-0.6.18", "triton",
        "q8kv8-sglang-0.5.23",
    ):  # fmt: skip
        assert {(build, m, "sparse-prefill") for m in ("v4-flash", "v3.2")} <= searched
    assert ("sglang-triton-0.5.23", "v4-flash", "decode-kernel") in searched
    assert ("sglang-triton-dsa-prefill-0.5.23", "v3.2", "sparse-prefill") in searched
    assert sc.limits[-1].backend == "tilelang-sglang-0.5.23"  # V3.2 only: its CUDA kernel
    assert sc.limits[-1].base.model == "v3.2"
    assert len(searched) == len(sc.limits) - 4  # FlashMLA builds, FA3 0.33.0: V4-Flash twice
    (instance,) = sc.instances
    assert instance["name"] == "sglang-triton-dsa-prefill-0.5.23"
    dsa = SglangTriton(**instance["options"])
    v4 = SglangTriton()
    for s in sc.limits[-3:-1]:  # the builds' own rules take both ends of the range
        b = v4 if s.base.route == "decode-kernel" else dsa
        assert b.case_reason(s.at(s.lo)) is None and b.case_reason(s.at(s.hi)) is None
    for s in sc.limits:
        assert s.base.op == "prefill" and "vllm-52339" in s.base.tags
        probe = s.at(163840)  # near the issue's 161K
        assert probe.context_len == 163840 and probe.tokens == s.base.tokens
        assert [i.tag for i in engine_issues.issues_of(probe)] == ["vllm-52339"]
