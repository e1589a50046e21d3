"""vLLM's batch-spec grammar (cases/batch_spec.py) against vLLM's own examples, its round trip,
its refusals, the split into the calls vLLM's sparse MLA backends make (cases/batch_parts.py),
and the `batch_spec` scenario key."""

from __future__ import annotations

import pytest

from dsv4bench import backends, scenarios
from dsv4bench.cases import batch_parts
from dsv4bench.cases.batch_spec import (
    BatchSpecError,
    Request,
    format_spec,
    parse,
    parse_segments,
)

# (spec, expected requests as (q_len, kv_len) runs). Cited from vLLM's
# benchmarks/attention_benchmarks: batch_spec.py's module docstring ("Examples") and
# test_batch_spec.py (test_basic_patterns, test_combined_patterns, test_extend_patterns,
# test_batch_stats).
VLLM_EXAMPLES = [
    ("q2k", [(1, 2048, 2048)]),  # docstring: [(2048, 2048)]; test_basic_patterns
    ("q1s1k", [(1, 1, 1024)]),  # docstring: decode, 1 token, 1K sequence
    ("8q1s1k", [(8, 1, 1024)]),  # docstring and test_basic_patterns: 8 x (1, 1024)
    ("q4s1k", [(1, 4, 1024)]),  # docstring and test_extend_patterns: 4-token extend
    ("2q1k_32q1s1k", [(2, 1024, 1024), (32, 1, 1024)]),  # docstring; test_combined_patterns: 34
    ("16q4s1k", [(16, 4, 1024)]),  # docstring: 16 spec decode requests
    ("q1ks2k", [(1, 1024, 2048)]),  # test_basic_patterns: context extension
    ("8q8s2k", [(8, 8, 2048)]),  # test_extend_patterns
    ("4q2k_8q4s1k_64q1s2k", [(4, 2048, 2048), (8, 4, 1024), (64, 1, 2048)]),  # 76 requests
    ("2q2k_32q1s1k", [(2, 2048, 2048), (32, 1, 1024)]),  # test_batch_stats: 2048*2 + 32 tokens
    ("16q1s512", [(16, 1, 512)]),  # configs/mla_sparse_decode.yaml: 16 requests, 512 KV
]


def expand(runs):
    return tuple(Request(q, kv) for n, q, kv in runs for _ in range(n))


@pytest.mark.parametrize(("spec", "runs"), VLLM_EXAMPLES, ids=[s for s, _ in VLLM_EXAMPLES])
def test_vllm_examples_expand_as_vllm_says(spec, runs):
    assert parse(spec) == expand(runs)


def test_vllm_stats_of_the_mixed_example():
    """test_batch_stats: 34 requests, 2 prefills, 32 decodes, 2048 * 2 + 32 tokens."""
    batch = parse("2q2k_32q1s1k")
    assert len(batch) == 34
    assert sum(r.q_len == r.kv_len for r in batch) == 2
    assert sum(r.q_len == 1 for r in batch) == 32
    assert sum(r.q_len for r in batch) == 2048 * 2 + 32


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("2q2k_32q1s1k", "2q2k_32q1s1k"),
        ("1q2048s2048", "q2k"),
        ("02q1024s1024_32q1s1024", "2q1k_32q1s1k"),
        ("q1ks2k", "q1ks2k"),
        ("16q1s512", "16q1s512"),
        ("3q100s1000", "3q100s1000"),
    ],
)
def test_round_trip_through_the_canonical_spelling(given, canonical):
    assert format_spec(parse_segments(given)) == canonical
    assert parse_segments(canonical) == parse_segments(given)
    assert parse(canonical) == parse(given)


@pytest.mark.parametrize(
    ("spec", "token"),
    [
        ("invalid", "invalid"),  # vLLM's test_error_handling
        ("2q2k__q1", ""),
        ("2q2K", "2q2K"),
        ("q1kv1k", "q1kv1k"),  # the README's older `kv` spelling is not the grammar
        ("0q1s1k", "0q1s1k"),
        ("q0", "q0"),
        ("q2ks1k", "q2ks1k"),  # s < q: the sequence cannot hold the query
        ("q１", "q１"),  # a non-ASCII digit (vLLM's `regex` would take it)
        ("q1s1k_", ""),
    ],
)
def test_bad_specs_name_the_token_in_one_line(spec, token):
    with pytest.raises(BatchSpecError) as e:
        parse(spec)
    message = str(e.value)
    assert "\n" not in message and repr(token) in message and "expected" in message


def test_empty_spec_is_refused():
    with pytest.raises(BatchSpecError, match="empty batch_spec"):
        parse("")


def fields(spec: str, heads: int, route: str | None = None) -> list[dict]:
    return [p.fields() for p in batch_parts.split(parse(spec), heads, route)]


def test_mixed_batch_splits_into_decodes_then_prefills():
    assert fields("2q2k_32q1s1k", 128) == [
        {"op": "decode", "batch_size": 32, "s_q": 1, "context_len": 1024},
        {
            "op": "prefill",
            "tokens": 2048,
            "route": "sparse-prefill",
            "context_lens": (2048, 2048),
        },
    ]


def test_spec_decode_is_a_decode_up_to_the_threshold():
    """FlashMLA sparse on sm90: 128 query tokens decode at 32 heads, 256 at 64 heads."""
    assert fields("16q4s1k", 128) == [
        {"op": "decode", "batch_size": 16, "s_q": 4, "context_len": 1024}
    ]
    assert fields("2q200s1k", 32)[0]["op"] == "prefill"
    assert fields("2q200s1k", 64)[0]["op"] == "decode"


def test_decodes_are_uniform_and_ragged_contexts_stay():
    """vLLM requires uniform decodes: a short request of another query length is a prefill."""
    got = fields("q4s1k_2q4s2k_3q1s512", 128)
    assert got[0] == {"op": "decode", "batch_size": 3, "s_q": 4, "context_lens": (1024, 2048, 2048)}
    assert got[1] == {
        "op": "prefill",
        "tokens": 1,
        "route": "sparse-prefill",
        "context_lens": (512, 512, 512),
    }


def test_few_heads_take_the_decode_kernel_route():
    """Below 32 heads vLLM's FlashMLA runs prefills on the FP8 decode kernel: route
    decode-mixed, one case per distinct request."""
    got = fields("2q2k_q1ks4k_8q1s1k", 16)
    assert [g["op"] for g in got] == ["decode", "prefill", "prefill"]
    assert {g["route"] for g in got[1:]} == {"decode-mixed"}
    assert [(g["tokens"], g["context_len"]) for g in got[1:]] == [(2048, 2048), (1024, 4096)]


TOY = """
name: toy-batch-spec
backends: [torch]
model: v3.2
sweep:
  num_heads: [64, 16]
cases:
  - batch_spec: ["2q2k_32q1s1k", "16q4s1k"]
    tags: [vllm]
"""


def load(text: str):
    backends.setup([])
    return scenarios.load_text(text, "toy.yaml", known_backends=backends.names())


def test_scenario_key_expands_each_spec_to_its_parts():
    sc = load(TOY)
    shapes = [(c.op, c.num_heads, c.batch_size, c.s_q, c.tokens, c.route) for c in sc.cases]
    assert shapes == [
        ("decode", 64, 32, 1, 0, "sparse-prefill"),
        ("prefill", 64, 2, 1, 2048, "sparse-prefill"),
        ("decode", 16, 32, 1, 0, "sparse-prefill"),
        ("prefill", 16, 1, 1, 2048, "decode-mixed"),
        ("decode", 64, 16, 4, 0, "sparse-prefill"),
        ("decode", 16, 16, 4, 0, "sparse-prefill"),
    ]
    assert sc.cases[1].context_lens == (2048, 2048)
    assert "batch-spec:2q2k_32q1s1k" in sc.cases[0].tags and "vllm" in sc.cases[0].tags
    assert "vllm-prefill" in sc.cases[1].tags


LIMIT = """
name: toy-limit
backends: [torch]
model: v3.2
limit: {batch_spec: q4s1k, axis: topk, lo: 64, hi: 1024, backend: torch}
"""


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        (TOY.replace('"16q4s1k"', '"16q4x1k"'), 8, "bad batch_spec token '16q4x1k'"),
        (TOY.replace("    tags: [vllm]", "    batch_size: 4"), 9, "sets batch_size"),
        (TOY.replace("model: v3.2", "model: v3.2\nop: decode"), 5, "sets op"),
        (LIMIT, 5, "a limit search varies one case"),
    ],
)
def test_scenario_errors_name_the_line(text, line, says):
    with pytest.raises(scenarios.ScenarioError) as e:
        load(text)
    assert says in str(e.value) and f"toy.yaml:{line}" in str(e.value)
