"""The helper ops' cases (cases/helper_cases.py): cache_write judged byte for byte, and vLLM's
prefill-workspace remap and chunked gather over ragged requests that cross chunk bounds."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.cases import helper_cases
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call, storage_bytes
from dsv4bench.cases.output import Output
from dsv4bench.measure import judge, metrics
from dsv4bench.scenarios.read import ScenarioError
from reference import prefill_chunks
from reference.cache_write import cache_write, token_records
from reference.layouts import gather_tokens
from tests.factories import V32, load_scenario, make_case

KNOWN = {"torch", "reference-f64"}


def _write_case(**kw):
    fields = dict(op="cache_write", layout="v32", d_qk=576, d_v=512, batch_size=3, s_q=2)
    fields.update(context_len=40, page_size=16)
    fields.update(kw)
    return make_case(**fields)


def test_cache_write_writes_only_the_new_tokens_slots():
    case = _write_case()
    x = make_inputs(case, "cpu")
    before = x["k_cache"].clone()
    out = oracle_call(case, x)().out.view(before.shape)
    changed = (out != before).any(-1).flatten().nonzero().flatten()
    slots = x["slot_mapping"][x["slot_mapping"] >= 0]
    assert set(changed.tolist()) <= set(slots.tolist()) and len(changed) >= len(slots) - 1
    assert x["slot_mapping"][-1] == -1 and len(x["kv"]) == len(slots) + 1
    assert case.query_tokens == 6 == len(slots)


def test_a_wrong_byte_is_counted_in_the_verdict():
    case = _write_case(layout="v4", d_qk=512)
    x = make_inputs(case, "cpu")
    expected = oracle_call(case, x)()
    assert judge.verdict(metrics.accuracy(expected, expected), case.tolerance) == ("ok", "")
    wrong = expected.out.clone()
    wrong[[3, 99, 1000]] ^= 0x10
    acc = metrics.accuracy(expected, Output(wrong))
    assert acc["bytes_differ"] == 3
    status, why = judge.verdict(acc, case.tolerance)
    assert status == "incorrect" and why == f"3 of {wrong.numel()} cache bytes differ"


def test_written_in_one_v41_arrangement_judged_in_the_other_fails():
    """The V4.1 conformance case: the same tokens written block-split, judged as interleaved."""
    interleaved = _write_case(layout="v41", d_qk=512, page_size=64, context_len=128)
    x = make_inputs(interleaved, "cpu")
    expected = oracle_call(interleaved, x)()
    written = cache_write(x["kv"], x["slot_mapping"], x["k_cache"], layout="v41-blocks")
    status, why = judge.verdict(
        metrics.accuracy(expected, Output(storage_bytes(written))), interleaved.tolerance
    )
    assert status == "incorrect" and "cache bytes differ" in why


def _remap_case(lens, tokens=16, context_len=64):
    return make_case(
        op="remap",
        layout="v32",
        d_qk=576,
        d_v=512,
        topk=16,
        tokens=tokens,
        context_len=context_len,
        page_size=16,
        batch_size=len(lens),
        context_lens=tuple(lens),
    )


def test_ragged_requests_cross_the_workspace_chunks():
    lens = [64, 60, 64, 64, 50, 64, 30]  # 396 > 5 x 64 rows: two chunks
    case = _remap_case(lens)
    chunks = helper_cases.chunks(case)
    assert chunks == [(0, 5), (5, 7)]
    x = make_inputs(case, "cpu")
    assert x["workspace_starts"].tolist() == [0, 64, 124, 188, 252, 0, 64]
    out = oracle_call(case, x)().out
    assert out.shape == (case.query_tokens, 16) == (16 * 7, 16)
    rows = prefill_chunks.workspace_rows(64)
    req = x["req_of_token"].long()
    valid = out >= 0
    assert bool((valid == (x["local_indices"] >= 0)).all())
    assert int(out[valid].max()) < rows
    # a request's rows lie inside its own slice of its chunk's workspace
    start = x["workspace_starts"].long()[req][:, None]
    length = x["seq_lens"].long()[req][:, None]
    assert bool(((out >= start) & (out < start + length) | ~valid).all())


@pytest.mark.parametrize("layout", ["v32", "indexer-fp8"])
def test_the_chunked_gather_is_every_requests_context_in_order(layout):
    # brute force: one token at a time, request after request (the chunks' workspaces end to
    # end); the indexer's keys as their record bytes, the rest upconverted to bf16
    lens = [64, 60, 64, 64, 50, 64, 30]  # two chunks of 5 x 64 rows, as the remap's
    d_qk = 576 if layout == "v32" else 128
    case = make_case(op="dequant", layout=layout, d_qk=d_qk, d_v=min(512, d_qk), tokens=16,
                     context_len=64, page_size=16, batch_size=7,
                     context_lens=tuple(lens))  # fmt: skip
    x = make_inputs(case, "cpu")
    assert x["chunk_bounds"].tolist() == [[0, 5], [5, 7]]
    rows = []
    for r, n in enumerate(lens):
        for i in range(n):
            slot = torch.tensor([int(x["block_table"][r, i // 16]) * 16 + i % 16])
            if layout == "v32":
                rows.append(gather_tokens(x["k_cache"], slot, layout=layout).bfloat16())
            else:
                rows.append(token_records(x["k_cache"], layout)[slot])
    assert torch.equal(oracle_call(case, x)().out, torch.cat(rows))


def test_scenario_rules_for_the_helper_ops():
    ok = load_scenario(
        """
        name: h
        arch: [cpu]
        backends: [torch]
        cases:
          - {op: cache_write, model: v4-flash, layout: v41-fp4-blocks, s_q: 2, context_len: 64,
             page_size: 64}
          - {op: remap, model: v3.2, tokens: 8, topk: 16, context_len: 64,
             batch_size: 2, context_lens: {lengths: [64, 20]}}
        """,
        KNOWN,
    )
    assert [c.op for c in ok.cases] == ["cache_write", "remap"]
    bad = {
        "layout: bf16": "cache_write writes an FP8 cache's records, got layout bf16",
        "s_q: 100": "expected 1 <= s_q <= context_len (64), got 100",
    }
    for line, message in bad.items():
        with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_scenario(
                f"""
                name: h
                arch: [cpu]
                backends: [torch]
                cases:
                  - {{op: cache_write, model: v3.2, context_len: 64, {line}}}
                """,
                KNOWN,
            )


def test_input_bytes_and_moved_bytes_count_the_rows():
    case = _write_case()
    assert metrics.attention_bytes(case) == 6 * (2 * 576 + 656)


def test_scenario_rules_for_the_dcp_form():
    head = "name: h\narch: [cpu]\nbackends: [torch]\ncases:\n"
    remap = "op: remap, model: v3.2, topk: 16, context_len: 64, page_size: 16"
    ok = load_scenario(f"{head}  - {{{remap}, form: dcp, dcp_size: 4, dcp_rank: [0, 3]}}\n", KNOWN)
    assert [(c.form, c.dcp_size, c.dcp_rank, c.dcp_interleave) for c in ok.cases] == [
        ("dcp", 4, 0, 1),
        ("dcp", 4, 3, 1),
    ]
    plain = make_case(op="remap", topk=16, context_len=64, page_size=16, **V32)
    assert "dcp" not in plain.case_id and "dcp_size" not in plain.params()
    bad = {
        f"{remap}, form: dcp, dcp_size: 2, dcp_rank: 2": "expected dcp_rank < dcp_size (2), got 2",
        f"{remap}, form: dcp, dcp_size: 2, dcp_interleave: 3": "a divisor of page_size (16), got 3",
        f"{remap}, dcp_size: 2": "only remap's forms dcp and dcp-compact have dcp_size",
        f"{remap}, form: dcp-compact, dcp_size: 2, dcp_rank: 5": "expected dcp_rank < dcp_size",
        f"{remap}, form: dcp, tokens: 8": "form dcp is the decode path's remap: expected tokens 0",
        f"{remap}, form: plain": "a remap's form is one of dcp, dcp-compact, got 'plain'",
        "op: dequant, model: v3.2, context_len: 64, form: dcp": "only topk and remap have a form",
    }
    for line, message in bad.items():
        with pytest.raises(ScenarioError) as info:
            load_scenario(f"{head}  - {{{line}}}\n", KNOWN)
        assert message in str(info.value) and "\n" not in str(info.value).strip(), info.value


def test_the_sm90_prefill_forms_cross_chunk_bounds_as_their_comments_say():
    from pathlib import Path

    from dsv4bench.backends import registry
    from dsv4bench.scenarios import load

    root = Path(__file__).resolve().parents[2]
    sc = load(root / "scenarios/sm90/dsa_helpers.yaml", known_backends=registry.catalog())
    forms = [c for c in sc.cases if c.op in ("remap", "dequant") and c.tokens]
    assert {(c.op, c.layout) for c in forms} == {
        ("remap", "v32"), ("dequant", "v32"), ("dequant", "indexer-fp8")
    }  # fmt: skip
    for c in forms:
        assert helper_cases.chunks(c) == [(0, 5), (5, 11), (11, 12)]


def test_a_gathers_moved_bytes_count_each_requests_tokens():
    lens = (64, 60, 30)
    ragged = dict(op="dequant", tokens=16, context_len=64, page_size=16, batch_size=3,
                  context_lens=lens)  # fmt: skip
    v32 = make_case(layout="v32", d_qk=576, d_v=512, **ragged)
    assert metrics.attention_bytes(v32) == 154 * (656 + 2 * 576)
    keys = make_case(layout="indexer-fp8", d_qk=128, d_v=128, **ragged)
    assert metrics.attention_bytes(keys) == 154 * 2 * 132
