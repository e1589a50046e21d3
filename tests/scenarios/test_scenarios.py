"""Scenario files: shipped files load, bad files fail with one precise line, expansion rules."""

from __future__ import annotations

import dataclasses
import re
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bench import backends, scenarios
from dsv4bench.cases.case import OPS, ROUTES, Case
from dsv4bench.kernels.catalog import known_builds
from dsv4bench.scenarios import ScenarioError, is_serving_text, load_text, validate_case
from tests.factories import V32, load_scenario, make_case

ROOT = Path(__file__).resolve().parents[2]
KNOWN = {
    "torch",
    "flashmla",
    "flashinfer",
    "flashinfer-e4m3",
    "triton",
    "fa3",
    "deepgemm",
    "reference-f64",
    "q8kv8",
}

# every registered backend with its declared options: files with instances load; every kernel
# build the catalog knows is a shipped instance too (backends/builds.py)
# (a runtime build, TileLang's compiler or its requirements, is no backend of its own)
BUILDS = {name for name, library in known_builds() if not library.startswith("tilelang-")}
CATALOG = backends.catalog()
assert set(CATALOG) >= BUILDS | KNOWN


# Expected (cases, jobs, limit searches) per shipped file: a change here is a change in how
# long the sweep takes, so it should be deliberate.
SHIPPED = {
    "smoke.yaml": (32, 64, 0),
    "sm90/decode_batch.yaml": (39, 165, 0),  # flashmla, triton, fa3, flashinfer (+ torch)
    "sm90/prefill_chunk.yaml": (24, 101, 1),
    "sm90/head_padding.yaml": (20, 80, 0),
    "sm90/layouts.yaml": (10, 40, 0),
    "sm90/triton_vs_flashmla.yaml": (32, 64, 0),
    "compare/triton_shapes_sm90.yaml": (44, 132, 0),  # triton and two FlashMLA builds
    "compare/backends_sm90.yaml": (40, 240, 0),  # with tilelang (issue 32)
    "compare/engines_sm90.yaml": (5, 10, 1),  # opt-in: studies/serving/COMMANDS.md
    "compare/builds_sm90.yaml": (19, 92, 7),  # every build: 10 instances, 7 limit searches
    "compare/releases_sm90.yaml": (9, 54, 0),  # vLLM 0.34.0 and FlashInfer 0.7.4 beside
    "compare/deepgemm_builds_sm90.yaml": (8, 40, 0),  # 5 DeepGEMM builds x next_n 1-4
    "sm90/indexer.yaml": (20, 40, 0),  # DeepGEMM and Triton in make bench
    "sm90/topk.yaml": (86, 240, 0),  # the indexer's top-k: torch, torch-topk, Triton, sglang
    "compare/topk_flashinfer_sm90.yaml": (86, 86, 0),  # opt-in: FlashInfer's top-k (slow JIT)
    "compare/c128_long_context_sm90.yaml": (4, 8, 0),  # opt-in (issue 22, item 17)
    "compare/v32_scales_sm90.yaml": (4, 8, 0),  # opt-in (issue 22, item 16)
    "compare/q8kv8_sm90.yaml": (33, 116, 0),  # opt-in (issue 32): q8kv8 vs the bf16 kernels
    "compare/sglang_triton_sm90.yaml": (36, 132, 0),  # opt-in (issue 36): sglang's Triton
    "measure/sm90.yaml": (15, 45, 0),  # opt-in: not part of `make bench`
    "sm100/decode_batch.yaml": (15, 45, 0),
    "sm120/decode_batch.yaml": (8, 24, 0),
    "indexer/sm90.yaml": (55, 114, 0),  # opt-in: not part of `make bench`
    "indexer/limits_sm90.yaml": (0, 0, 8),
    "indexer/deepgemm_limits_sm90.yaml": (0, 0, 1),  # opt-in: DeepGEMM's paged batch limit
    # opt-in (issue 13): the sm90 cases on two FlashMLA builds; the TP x route crossover
    "sm90/dsa_helpers.yaml": (36, 188, 0),
    "engines/flashmla_builds_sm90.yaml": (96, 192, 0),
    "engines/flashmla_route_limits_sm90.yaml": (0, 0, 6),
    "engines/tp_route_crossover_sm90.yaml": (150, 150, 0),
    # opt-in (issue 23): ragged batches, index locality, 256K..1M contexts
    "workloads/ragged_sm90.yaml": (11, 44, 0),
    "workloads/locality_sm90.yaml": (18, 72, 0),
    "workloads/long_context_sm90.yaml": (24, 96, 0),
    # opt-in (issue 33): the support envelope, one small call per cell
    "envelope/sm90.yaml": (720, 3960, 0),  # 3150 cells, 810 more with heads raw
    # opt-in (issue 33): the engines' failure shapes, the prefill context limit per build
    "failures/sm90.yaml": (15, 180, 0),  # 12 instances: every sm90 build that takes them
    "failures/prefill_context_limit_sm90.yaml": (0, 0, 25),  # every sm90 prefill build
    # opt-in (issue 35): vLLM's mla_sparse_decode.yaml through `import vllm-bench`
    "compare/vllm_mla_sparse_decode_sm90.yaml": (72, 144, 0),
    # opt-in (issue 35): the two flashinfer-bench DSA definitions through `import flashinfer-bench`
    "compare/flashinfer_bench_dsa_sm90.yaml": (7, 77, 0),
}


load = partial(load_scenario, known_backends=KNOWN)


HEAD = """\
name: t
op: decode
model: v3.2
backends: [flashmla]
"""


def error_of(text: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load(text)
    return info.value


# ---- shipped files -------------------------------------------------------------------------


def test_every_shipped_file_is_listed():
    root = ROOT / "scenarios"
    found = {p.relative_to(root).as_posix() for p in scenarios.discover(root)}
    serving = {f for f in found if is_serving_text((root / f).read_text())}  # test_serving.py
    assert found - serving == set(SHIPPED)


@pytest.mark.parametrize("rel", sorted(SHIPPED))
def test_shipped_scenario_loads_and_expands(rel):
    path = ROOT / "scenarios" / rel
    sc = scenarios.load(path, known_backends=CATALOG)
    cases = scenarios.expand(sc)
    assert (len(cases), len(sc.jobs()), len(sc.limits)) == SHIPPED[rel]
    assert len({c.case_id for c in cases}) == len(cases)
    assert sc.source == str(path)
    for case in cases + [s.base for s in sc.limits] + [s.at(s.hi) for s in sc.limits]:
        assert validate_case(case) is None, case
        assert case.scenario == sc.name
        assert Case.from_dict(case.to_dict()) == case
    if "sm90" in rel:
        assert sc.arch == ["sm90"]


def test_smoke_covers_every_op_on_the_cpu():
    sc = scenarios.load(ROOT / "scenarios/smoke.yaml", known_backends=KNOWN)
    # the oracle, and an independent implementation that checks it on a CPU
    assert "cpu" in sc.arch and sc.backends == ["torch", "reference-f64"]
    assert {c.op for c in sc.cases} == set(OPS)
    assert {c.layout for c in sc.cases} == {"v32", "v4"}
    assert {c.route for c in sc.cases if c.op == "prefill"} == set(ROUTES)
    assert any(c.extra_topk and c.sink for c in sc.cases if c.op == "decode")
    assert max(c.context_len * c.batch_size for c in sc.cases) <= 4096  # seconds on a CPU


def test_sm90_set_stays_small():
    jobs = sum(SHIPPED[rel][1] for rel in SHIPPED if rel.startswith("sm90/"))
    # under a second each plus one bisection: 64 jobs of triton_vs_flashmla.yaml (Triton
    # compiles included) ran in 25 s on an H100 (triton-h100, in git history);
    # every found backend runs by default (issue 19): fa3 and flashinfer joined flashmla and
    # triton in four of the five files
    # the indexer (sm90/indexer.yaml, 40 jobs) joined in issue 31; its top-k alone
    # (sm90/topk.yaml, 120 jobs: 22 s on an H100, results/sm90/studies/topk) in issue 32, and
    # sglang's JIT top-k beside it (86 jobs, plus about a minute of nvcc for its three modules);
    # torch.topk as engines call it (torch-topk, 34 plain-form jobs of milliseconds) in issue 48;
    # the engines' DSA-path helpers (sm90/dsa_helpers.yaml, 154 jobs of milliseconds) in issue 46,
    # its DCP remaps, indexer cache ops, chunked gathers and vLLM's V4 writers after
    assert jobs <= 960


def test_prefill_limit_search_matches_the_sglang_question():
    sc = scenarios.load(ROOT / "scenarios/sm90/prefill_chunk.yaml", known_backends=KNOWN)
    (s,) = sc.limits
    assert (s.axis, s.lo, s.hi, s.backend) == ("tokens", 8192, 16384, "flashmla")
    assert s.base.route == "decode-kernel" and s.base.model == "v4-flash"
    assert s.base.tokens == 8192 and s.at(16384).tokens == 16384
    assert s.limit_id.startswith("limit-tokens-")


def test_decode_batch_oracle_subset():
    sc = scenarios.load(ROOT / "scenarios/sm90/decode_batch.yaml", known_backends=KNOWN)
    with_torch = [c for c in sc.cases if "torch" in sc.backends_for(c)]
    assert len(with_torch) == 9
    assert all("oracle-timing" in c.tags for c in with_torch)
    assert {c.batch_size for c in with_torch} == {1, 64, 256}


def test_prefill_chunk_oracle_subset():
    """The oracle is timed on throughput chunks (>= 4096) and V4-Flash's 32K x h64 x top-640."""
    sc = scenarios.load(ROOT / "scenarios/sm90/prefill_chunk.yaml", known_backends=KNOWN)
    with_torch = [c for c in sc.cases if "torch" in sc.backends_for(c)]
    assert all("oracle-timing" in c.tags and c.route == "sparse-prefill" for c in with_torch)
    assert sorted((c.model, c.tokens) for c in with_torch) == [
        ("v3.2", 4096),
        ("v3.2", 8192),
        ("v4-flash", 4096),
        ("v4-flash", 8192),
        ("v4-flash", 32768),
    ]
    whole = next(c for c in with_torch if c.tokens == 32768)
    assert (whole.num_heads, whole.topk + whole.extra_topk) == (64, 640)


def test_doc_example_loads():
    doc = (ROOT / "docs/scenarios.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", doc, re.S).group(1)
    sc = load_text(example, "doc.yaml", known_backends=KNOWN)
    assert (len(sc.cases), len(sc.limits)) == (26, 2)


# ---- errors: one line, the right line, the right key path -----------------------------------

BAD = [
    # (id, yaml, line, key path, part of the message)
    ("unknown key", HEAD + "defaults:\n  batchsize: 4\n", 6, "defaults.batchsize", "did you mean batch_size?"),  # noqa: E501
    ("unknown top key", HEAD + "sweeps: {batch_size: [1]}\n", 5, "sweeps", "did you mean sweep?"),
    ("bool is not int", HEAD + "defaults:\n  batch_size: true\n", 6, "defaults.batch_size", "expected a positive integer, got true"),  # noqa: E501
    ("quoted int", HEAD + "defaults:\n  topk: '64'\n", 6, "defaults.topk", "got '64'"),
    ("float is not int", HEAD + "defaults:\n  topk: 64.0\n", 6, "defaults.topk", "got 64.0"),
    ("negative size", HEAD + "sweep:\n  batch_size: [1, 2, -4]\n", 6, "sweep.batch_size[2]", "expected a positive integer, got -4"),  # noqa: E501
    ("negative in block list", HEAD + "sweep:\n  batch_size:\n    - 1\n    - 0\n", 8, "sweep.batch_size[1]", "positive integer, got 0"),  # noqa: E501
    ("topk > context", HEAD + "cases:\n  - context_len: 1024\n  - context_len: 512\n    topk: 1024\n", 8, "cases[1].topk", "expected topk <= context_len (512), got 1024"),  # noqa: E501
    ("context < default topk", HEAD + "defaults: {topk: 2048}\ncases:\n  - context_len: 1024\n", 7, "cases[0].context_len", "expected context_len >= topk (2048), got 1024"),  # noqa: E501
    ("unknown backend", HEAD.replace("[flashmla]", "[flashmla, flashmlx]"), 4, "backends[1]", "unknown backend 'flashmlx'; did you mean flashmla?"),  # noqa: E501
    ("unknown arch", HEAD + "arch: [sm90, sm89]\n", 5, "arch[1]", "unknown arch 'sm89'"),
    ("unknown layout", HEAD + "defaults: {layout: fp8}\n", 5, "defaults.layout", "unknown layout 'fp8'"),  # noqa: E501
    ("layout vs d_qk", HEAD + "cases:\n  - layout: v4\n", 6, "cases[0].layout", "layout v4 needs d_qk 512"),  # noqa: E501
    ("unknown model", HEAD.replace("v3.2", "v4-flsh"), 3, "model", "did you mean v4-flash?"),
    ("unknown op", HEAD.replace("op: decode", "op: decoding"), 2, "op", "did you mean decode?"),
    ("duplicate key", HEAD + "sweep:\n  batch_size: [1]\n  s_q: [1]\n  batch_size: [2]\n", 8, "sweep.batch_size", "duplicate key (first given at line 6)"),  # noqa: E501
    ("duplicate top key", HEAD + "op: prefill\n", 5, "op", "duplicate key (first given at line 2)"),
    ("python tag", HEAD + "description: !!python/object/apply:os.system ['true']\n", 5, "description", "Python tags are not allowed"),  # noqa: E501
    ("other tag", HEAD + "seed: !!binary aGVsbG8=\n", 5, "seed", "unsupported YAML tag !!binary"),
    ("merge key", HEAD + "defaults:\n  <<: {topk: 64}\n", 6, "defaults", "merge keys"),
    ("limit axis not a size", HEAD + "limit: {axis: layout, lo: 1, hi: 2, backend: flashmla}\n", 5, "limit.axis", "limit axis (a size axis)"),  # noqa: E501
    ("limit lo >= hi", HEAD + "limit:\n  axis: batch_size\n  lo: 64\n  hi: 64\n  backend: flashmla\n", 8, "limit.hi", "expected hi > lo (64), got 64"),  # noqa: E501
    ("limit step too coarse", HEAD + "limit:\n  axis: batch_size\n  lo: 1\n  hi: 9\n  step: 8\n  backend: flashmla\n", 9, "limit.step", "expected step < hi - lo (8), got 8"),  # noqa: E501
    ("limit probe outside", HEAD + "limit:\n  axis: batch_size\n  lo: 1\n  hi: 9\n  probe: [4, 9]\n  backend: flashmla\n", 9, "limit.probe[1]", "expected a probe between lo (1) and hi (9), got 9"),  # noqa: E501
    ("limit probe not a size", HEAD + "limit:\n  axis: batch_size\n  lo: 1\n  hi: 9\n  probe: 4.5\n  backend: flashmla\n", 9, "limit.probe", "expected a positive integer, got 4.5"),  # noqa: E501
    ("limit missing hi", HEAD + "limit:\n  axis: batch_size\n  lo: 64\n  backend: flashmla\n", 6, "limit.hi", "required key missing"),  # noqa: E501
    ("limit unknown backend", HEAD + "limit: {axis: batch_size, lo: 1, hi: 2, backend: trt}\n", 5, "limit.backend", "unknown backend 'trt'"),  # noqa: E501
    ("limit axis swept", HEAD + "sweep: {batch_size: [1, 2]}\nlimit:\n  axis: batch_size\n  lo: 1\n  hi: 8\n  backend: flashmla\n", 7, "limit.axis", "batch_size is swept (line 5)"),  # noqa: E501
    ("limit axis in entry", HEAD + "limit:\n  axis: batch_size\n  batch_size: 4\n  lo: 1\n  hi: 8\n  backend: flashmla\n", 7, "limit.batch_size", "the search sets it"),  # noqa: E501
    ("limit hi invalid", HEAD.replace("decode", "prefill") + "limit:\n  axis: tokens\n  lo: 4096\n  hi: 16384\n  backend: flashmla\n", 8, "limit.hi", "expected tokens <= context_len (8192), got 16384"),  # noqa: E501
    ("empty sweep list", HEAD + "sweep:\n  batch_size: []\n", 6, "sweep.batch_size", "non-empty list"),  # noqa: E501
    ("empty sweep", HEAD + "sweep: {}\n", 5, "sweep", "at least one axis"),
    ("empty cases", HEAD + "cases: []\n", 5, "cases", "non-empty list"),
    ("repeated value", HEAD + "sweep: {batch_size: [1, 2, 1]}\n", 5, "sweep.batch_size[2]", "duplicate value 1 (also at [0])"),  # noqa: E501
    ("list in defaults", HEAD + "defaults:\n  batch_size: [1, 2]\n", 6, "defaults.batch_size", "expected one value"),  # noqa: E501
    ("swept and per case", HEAD + "sweep:\n  s_q: [1, 2]\ncases:\n  - s_q: 4\n", 8, "cases[0].s_q", "s_q is also swept (line 6)"),  # noqa: E501
    ("extra > entries", HEAD.replace("v3.2", "v4-flash") + "defaults:\n  context_len: 1024\n  extra_topk: 512\n", 7, "defaults.extra_topk", "expected extra_topk <= context_len // compress_ratio = 1024 // 4 = 256, got 512"),  # noqa: E501
    ("extra without ratio", HEAD + "defaults: {extra_topk: 64}\n", 5, "defaults.extra_topk", "needs compress_ratio 4 or 128"),  # noqa: E501
    ("bad ratio", HEAD + "defaults: {compress_ratio: 8}\n", 5, "defaults.compress_ratio", "expected 0, 4 or 128, got 8"),  # noqa: E501
    ("topk > window", HEAD.replace("v3.2", "v4-pro") + "defaults: {topk: 256}\n", 5, "defaults.topk", "the main-cache indices are the window"),  # noqa: E501
    ("tp does not divide", HEAD + "sweep: {tp: [1, 2, 3]}\n", 5, "sweep.tp[2]", "tp 3 does not divide v3.2's 128 heads"),  # noqa: E501
    ("tp and num_heads", HEAD + "defaults: {num_heads: 64}\ncases:\n  - tp: 2\n", 7, "cases[0].tp", "give tp or num_heads, not both (num_heads also at line 5)"),  # noqa: E501
    ("num_heads and tp", HEAD + "defaults: {tp: 2}\ncases:\n  - num_heads: 64\n", 7, "cases[0].num_heads", "give tp or num_heads, not both (tp also at line 5)"),  # noqa: E501
    ("route on decode", HEAD + "cases:\n  - route: decode-kernel\n", 6, "cases[0].route", "only prefill has route"),  # noqa: E501
    ("tokens on decode", HEAD + "defaults: {tokens: 64}\n", 5, "defaults.tokens", "only prefill has tokens"),  # noqa: E501
    ("batch on prefill", HEAD + "cases:\n  - {op: prefill, batch_size: 4}\n", 6, "cases[0].batch_size", "expected batch_size 1, got 4"),  # noqa: E501
    ("scale per layout", HEAD + "defaults: {scale_convention: vllm}\n", 5, "defaults.scale_convention", "layout v32 takes pow2 or raw"),  # noqa: E501
    ("scale on bf16", HEAD + "defaults: {layout: bf16, scale_convention: raw}\n", 5, "defaults.scale_convention", "bf16 rows have no scales"),  # noqa: E501
    ("head padding too small", HEAD + "defaults: {head_padding: 64}\n", 5, "defaults.head_padding", "pads to 64 heads, fewer than num_heads (128)"),  # noqa: E501
    ("bad head padding", HEAD + "defaults: {head_padding: 96}\n", 5, "defaults.head_padding", "expected one of engine, none, raw, 64, 128, got 96"),  # noqa: E501
    ("bad sink", HEAD + "defaults: {sink: 1}\n", 5, "defaults.sink", "expected true or false, got 1"),  # noqa: E501
    ("missing name", "op: decode\nmodel: v3.2\nbackends: [torch]\n", 1, "name", "required key missing"),  # noqa: E501
    ("missing backends", "name: t\nop: decode\nmodel: v3.2\n", 1, "backends", "required key missing"),  # noqa: E501
    ("missing op", "name: t\nmodel: v3.2\nbackends: [torch]\ncases:\n  - {batch_size: 2}\n  - {op: decode}\n", 5, "cases[0].op", "required key missing"),  # noqa: E501
    ("bad name", "name: my scenario\n", 1, "name", "expected letters, digits"),
    ("not a mapping", "- a\n- b\n", 1, "(top)", "expected a mapping of scenario keys"),
    ("empty file", "# nothing\n", 1, "(top)", "got an empty file"),
    ("yaml syntax", HEAD + "sweep:\n  batch_size: [1, 2\n", 7, "(yaml)", "invalid YAML"),
    ("two documents", HEAD + "---\nname: u\n", 5, "(yaml)", "expected a single document"),
    ("range both steps", HEAD + "sweep:\n  batch_size: {from: 1, to: 8, mul: 2, step: 1}\n", 6, "sweep.batch_size", "exactly one of mul or step"),  # noqa: E501
    ("range backwards", HEAD + "sweep:\n  batch_size: {from: 8, to: 1, step: 1}\n", 6, "sweep.batch_size.to", "expected to >= from (8), got 1"),  # noqa: E501
    ("range unknown key", HEAD + "sweep:\n  batch_size: {from: 1, to: 8, times: 2}\n", 6, "sweep.batch_size.times", "unknown key"),  # noqa: E501
    ("range on enum", HEAD + "sweep:\n  layout: {from: 1, to: 8, mul: 2}\n", 6, "sweep.layout", "unknown layout"),  # noqa: E501
    ("timing type", HEAD + "timing: {iters: 0}\n", 5, "timing.iters", "expected a positive integer, got 0"),  # noqa: E501
    ("timer", HEAD + "timing: {timer: cupti}\n", 5, "timing.timer", "unknown timer 'cupti'"),
    ("tolerance", HEAD + "tolerance: {cos_diff: -1e-6}\n", 5, "tolerance.cos_diff", "non-negative number"),  # noqa: E501
    ("custom model keys", HEAD.replace("model: v3.2", "model: {d_qk: 576, num_heads: 16, topk: 64, heads: 2}"), 3, "model.heads", "unknown key"),  # noqa: E501
    ("custom model layout", HEAD.replace("model: v3.2", "model:\n  d_qk: 256\n  num_heads: 16\n  topk: 64\n  layout: v4"), 7, "model.layout", "layout v4 needs d_qk 512"),  # noqa: E501
    ("custom model name", HEAD.replace("model: v3.2", "model: {name: v3.2, d_qk: 576, num_heads: 8, topk: 64}"), 3, "model.name", "built-in model"),  # noqa: E501
    ("entry unknown key", HEAD + "cases:\n  - {batch: 2}\n", 6, "cases[0].batch", "did you mean batch_size?"),  # noqa: E501
    ("entry backends", HEAD + "cases:\n  - {backends: [cutlass]}\n", 6, "cases[0].backends[0]", "unknown backend 'cutlass'"),  # noqa: E501
    ("first error wins", HEAD + "defaults: {topk: -1}\nsweep: {s_q: [0]}\n", 5, "defaults.topk", "positive integer, got -1"),  # noqa: E501
]  # fmt: skip


@pytest.mark.parametrize("text,line,path,needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_scenario_gives_one_precise_line(text, line, path, needle):
    e = error_of(text)
    msg = str(e)
    assert "\n" not in msg
    assert msg.startswith(f"x.yaml:{line}: {path}: "), msg
    assert needle in msg, msg
    assert (e.file, e.line, e.path) == ("x.yaml", line, path)


def test_error_example_from_the_brief():
    text = HEAD + "sweep:\n  batch_size: [1, 2, -4]\n"
    with pytest.raises(ScenarioError) as info:
        load_text(text, "scenarios/x.yaml", known_backends=KNOWN)
    assert str(info.value) == (
        "scenarios/x.yaml:6: sweep.batch_size[2]: expected a positive integer, got -4"
    )


def test_python_tags_are_never_constructed(tmp_path):
    marker = tmp_path / "pwned"
    text = HEAD + f"description: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(ScenarioError):
        load(text)
    assert not marker.exists()


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(ScenarioError) as info:
        scenarios.load(tmp_path / "nope.yaml", known_backends=KNOWN)
    assert str(info.value).startswith(f"{tmp_path / 'nope.yaml'}:1: (file): cannot read")


# ---- expansion -----------------------------------------------------------------------------


def test_cartesian_product_order_and_count():
    sc = load(HEAD + "sweep:\n  batch_size: [1, 2, 4]\n  s_q: [1, 2, 3, 4]\n")
    assert len(sc.cases) == 12
    pairs = [(c.batch_size, c.s_q) for c in sc.cases]
    assert pairs[:5] == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1)]  # last axis fastest


def test_cases_crossed_with_sweep_and_entry_lists():
    sc = load(
        HEAD
        + """\
sweep:
  batch_size: [1, 2]
cases:
  - {s_q: [1, 2], num_heads: [64, 128]}
  - {model: v4-flash}
"""
    )
    assert len(sc.cases) == 2 * 2 * 2 + 1 * 2
    assert [c.model for c in sc.cases].count("v4-flash") == 2


def test_cases_merge_over_defaults_and_top_level():
    sc = load(
        HEAD
        + """\
defaults:
  context_len: 4096
  s_q: 2
cases:
  - {}
  - {topk: 1024, s_q: 1}
  - {model: v4-pro, context_len: 65536}
"""
    )
    a, b, c = sc.cases
    assert (a.model, a.context_len, a.s_q, a.topk) == ("v3.2", 4096, 2, 2048)
    assert (b.context_len, b.s_q, b.topk) == (4096, 1, 1024)
    assert (c.model, c.num_heads, c.context_len, c.s_q, c.topk, c.extra_topk) == (
        "v4-pro",
        128,
        65536,
        2,
        128,
        1024,
    )
    assert c.d_qk == 512 and c.layout == "v4" and c.sink


def test_defaults_topk_blamed_when_it_breaks_a_later_model():
    e = error_of(HEAD + "defaults:\n  topk: 512\ncases:\n  - {model: v4-pro}\n")
    assert e.path == "defaults.topk" and "window" in e.message


def test_tp_sets_heads_per_rank():
    sc = load(HEAD.replace("v3.2", "v4-flash") + "sweep:\n  tp: [1, 2, 4, 8, 16]\n")
    assert [c.num_heads for c in sc.cases] == [64, 32, 16, 8, 4]
    assert sc.cases[3].tags == ("tp8",)


def test_range_forms():
    sc = load(HEAD + "sweep:\n  batch_size: {from: 1, to: 256, mul: 2}\n")
    assert [c.batch_size for c in sc.cases] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    sc = load(HEAD + "sweep:\n  batch_size: {from: 3, to: 100, mul: 3}\n")
    assert [c.batch_size for c in sc.cases] == [3, 9, 27, 81]
    sc = load(HEAD + "cases:\n  - context_len: {from: 2048, to: 8192, step: 2048}\n")
    assert [c.context_len for c in sc.cases] == [2048, 4096, 6144, 8192]
    sc = load(HEAD + "sweep:\n  s_q: 2\n")  # one value is a list of one
    assert [c.s_q for c in sc.cases] == [2]


def test_determinism_same_file_same_ids():
    text = (ROOT / "scenarios/sm90/decode_batch.yaml").read_text()
    a = load_text(text, "a.yaml", known_backends=KNOWN)
    b = load_text(text, "b.yaml", known_backends=KNOWN)
    assert [c.case_id for c in a.cases] == [c.case_id for c in b.cases]
    assert a.cases == [dataclasses.replace(c) for c in b.cases]


def test_repeated_point_runs_once_with_union_of_backends_and_tags():
    sc = load(
        HEAD
        + """\
tags: [all]
cases:
  - {batch_size: [1, 2], tags: [main]}
  - {batch_size: 1, backends: [torch], tags: [oracle]}
"""
    )
    assert len(sc.cases) == 2
    one, two = sc.cases
    assert one.tags == ("all", "main", "oracle")
    assert sc.backends_for(one) == ("flashmla", "torch")
    assert sc.backends_for(two) == ("flashmla",)
    assert sc.jobs() == [(one, "flashmla"), (one, "torch"), (two, "flashmla")]


def test_model_defaults():
    sc = load(HEAD + "cases:\n  - {model: v3.2}\n  - {model: v4-flash}\n  - {model: v4-pro}\n")
    v32, flash, pro = sc.cases
    assert (v32.d_qk, v32.num_heads, v32.topk, v32.extra_topk) == (576, 128, 2048, 0)
    assert v32.layout == "v32"
    assert (v32.page_size, v32.window, v32.compress_ratio, v32.sink) == (64, 0, 0, False)
    assert v32.scale_convention == "pow2" and v32.context_len == 8192 and v32.tokens == 0
    assert (flash.d_qk, flash.num_heads, flash.topk, flash.extra_topk) == (512, 64, 128, 512)
    assert (flash.window, flash.compress_ratio, flash.page_size, flash.sink) == (128, 4, 256, True)
    assert flash.layout == "v4" and flash.scale_convention == "flashmla"
    assert flash.softmax_scale == pytest.approx(512**-0.5)
    assert (pro.num_heads, pro.extra_topk) == (128, 1024)


def test_short_context_shortens_default_topk():
    sc = load(
        HEAD
        + """\
cases:
  - {context_len: 256}
  - {model: v4-flash, context_len: 256}
  - {model: v4-flash, context_len: 64}
  - {model: v4-flash, compress_ratio: 128, context_len: 1024}
"""
    )
    assert [(c.topk, c.extra_topk) for c in sc.cases] == [(256, 0), (128, 64), (64, 16), (128, 8)]


def test_prefill_defaults_and_mixed_ops():
    sc = load(
        "name: t\nmodel: v4-flash\nbackends: [torch]\n"
        "cases:\n  - {op: prefill}\n  - {op: decode, batch_size: 4}\n  - {op: remap}\n"
    )
    prefill, decode, remap = sc.cases
    assert (prefill.tokens, prefill.batch_size, prefill.route) == (4096, 1, "sparse-prefill")
    assert (decode.tokens, decode.batch_size) == (0, 4)
    assert remap.op == "remap" and sc.op == "mixed"


def test_custom_model_mapping():
    sc = load(
        HEAD.replace("model: v3.2", "model: {name: tiny, d_qk: 576, num_heads: 16, topk: 64}")
        + "defaults: {context_len: 256}\n"
    )
    (c,) = sc.cases
    assert (c.model, c.d_qk, c.d_v, c.num_heads, c.topk) == ("tiny", 576, 512, 16, 64)
    assert c.layout == "v32"
    assert c.softmax_scale == pytest.approx(576**-0.5) and c.page_size == 64


def test_head_padding_int_is_stored_as_str():
    sc = load(HEAD + "defaults: {head_padding: 128}\n")
    assert sc.cases[0].head_padding == "128"


def test_plain_exponent_floats_and_timing():
    sc = load(
        HEAD + "tolerance: {cos_diff: 5e-6, lse_abs: 1}\ntiming: {timer: both, timeout_s: 60}\n"
    )
    c = sc.cases[0]
    assert c.tolerance.cos_diff == 5e-6 and c.tolerance.lse_abs == 1.0
    assert c.timing.timer == "both" and c.timing.timeout_s == 60.0 and c.timing.iters == 20


def test_quoted_exponent_is_text():
    e = error_of(HEAD + "tolerance: {cos_diff: '5e-6'}\n")
    assert e.path == "tolerance.cos_diff"


def test_limit_only_file_runs_no_plain_cases():
    sc = load(
        HEAD.replace("decode", "prefill")
        + "defaults: {context_len: 32768, route: decode-kernel}\n"
        + "limit: {axis: tokens, lo: 8192, hi: 16384, backend: flashmla, model: [v3.2, v4-flash]}\n"
    )
    assert sc.cases == []
    assert [s.base.model for s in sc.limits] == ["v3.2", "v4-flash"]
    assert all(s.base.tokens == 8192 and s.base.route == "decode-kernel" for s in sc.limits)
    assert all(s.step == 1 for s in sc.limits)  # exact unless a step is given
    entry = "limit: {axis: batch_size, lo: 1, hi: 4096, step: 64, backend: flashmla}\n"
    stepped = load(HEAD + entry)
    assert stepped.limits[0].step == 64


def test_limit_crossed_with_sweep():
    limit = "limit: {axis: batch_size, lo: 1024, hi: 65536, backend: flashmla}\n"
    sc = load(HEAD + "sweep: {s_q: [1, 2]}\n" + limit)
    assert len(sc.cases) == 2 and len(sc.limits) == 2
    assert [s.base.s_q for s in sc.limits] == [1, 2]
    assert all(s.base.batch_size == 1024 for s in sc.limits)


def test_backends_all_and_single_names():
    sc = load(HEAD.replace("[flashmla]", "all") + "arch: sm90\ntags: smoke\n")
    assert sc.backends == sorted(KNOWN) and sc.arch == ["sm90"] and sc.tags == ["smoke"]


# ---- validate_case -------------------------------------------------------------------------


# scale_convention: Case's own default (flashmla) is a v4 convention
VALID = {**V32, "scenario": "s", "num_heads": 128, "scale_convention": "pow2"}


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({}, None),
        ({"topk": 8192, "context_len": 4096}, "topk: expected topk <= context_len (4096)"),
        ({"layout": "v4"}, "layout: layout v4 needs d_qk 512, the model has d_qk 576"),
        ({"batch_size": True}, "batch_size: expected a positive integer"),
        ({"op": "prefill", "tokens": 0}, "tokens: expected a positive integer"),
        ({"tokens": 16}, "tokens: only prefill has tokens"),
        ({"route": "decode-kernel"}, "route: only prefill has a route"),
        ({"scale_convention": "vllm"}, "scale_convention: layout v32 takes pow2 or raw"),
        ({"scale_convention": "flashmla"}, "scale_convention: layout v32 takes pow2 or raw"),
        ({"extra_topk": 64}, "extra_topk: an extra cache needs compress_ratio"),
        ({"head_padding": "64"}, "num_heads: expected at most head_padding (64) heads"),
        ({"d_qk": 512, "layout": "bf16"}, "model: v3.2 has d_qk 576"),
        ({"timing": dataclasses.replace(make_case(VALID).timing, timer="x")}, "timing.timer"),
        ({"tags": ("",)}, "tags:"),
    ],
)
def test_validate_case(kw, needle):
    got = validate_case(make_case(VALID, **kw))
    if needle is None:
        assert got is None
    else:
        assert got is not None and got.startswith(needle), got


def test_validate_case_accepts_the_scale_convention_default_of_bf16():
    assert validate_case(make_case(VALID, layout="bf16", d_qk=256, d_v=256, model="custom")) is None


# ---- properties ----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.integers(1, 512), min_size=1, max_size=6, unique=True),
    s_qs=st.lists(st.integers(1, 4), min_size=1, max_size=4, unique=True),
    models=st.lists(st.sampled_from(["v3.2", "v4-flash", "v4-pro"]), min_size=1, unique=True),
)
def test_expansion_count_is_the_product(batches, s_qs, models):
    text = (
        "name: p\nop: decode\nbackends: [torch]\n"
        f"sweep:\n  model: {models}\n  batch_size: {batches}\n  s_q: {s_qs}\n"
    ).replace("'", "")
    sc = load_text(text, "p.yaml", known_backends=KNOWN)
    assert len(sc.cases) == len(batches) * len(s_qs) * len(models)
    assert len({c.case_id for c in sc.cases}) == len(sc.cases)


# ---- include: another file's cases on this file's backends ---------------------------------

INCLUDED = """\
name: inc
op: decode
model: v3.2
backends: [flashmla, triton]
timing: {iters: 7}
tags: [orig]
cases:
  - batch_size: [1, 2]
  - batch_size: 4
    backends: [torch]
limit: {axis: batch_size, lo: 8, hi: 16, backend: flashmla}
"""


def test_include_runs_another_files_cases_on_this_files_backends(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.yaml").write_text(INCLUDED)
    (tmp_path / "sub" / "b.yaml").write_text(INCLUDED.replace("name: inc", "name: inc-b"))
    main = tmp_path / "main.yaml"
    main.write_text(
        "name: builds\nbackends:\n  - {name: flashmla, as: fm-a, lib: /a}\n"
        "  - {name: flashmla, as: fm-b, lib: /b}\ntags: [mine]\ninclude: sub/*.yaml\n"
        "limit: {axis: tokens, lo: 8, hi: 16, backend: fm-b, op: prefill, model: v4-flash,"
        " route: decode-mixed, context_len: 64}\n"
    )
    sc = scenarios.load(main, known_backends=CATALOG)
    assert sc.included == [str(tmp_path / "sub" / n) for n in ("a.yaml", "b.yaml")]
    # the same three points in both files run once, tagged with both names
    assert [c.batch_size for c in sc.cases] == [1, 2, 4]
    assert all(c.scenario == "builds" and c.timing.iters == 7 for c in sc.cases)
    assert all({"orig", "inc", "inc-b", "mine"} <= set(c.tags) for c in sc.cases)
    # this file's backends for every case (not the entry's [torch]); its own limit only
    assert [b for _, b in sc.jobs()] == ["fm-a", "fm-b"] * 3
    assert [(s.axis, s.backend, s.base.route) for s in sc.limits] == [
        ("tokens", "fm-b", "decode-mixed")
    ]


@pytest.mark.parametrize(
    "include, files, message",
    [
        ("nothing/*.yaml", {}, "include[0]: 'nothing/*.yaml' names no file under"),
        ("gone.yaml", {}, "include[0]: 'gone.yaml' names no file under"),
        ("main.yaml", {}, "include[0]: 'main.yaml' names this file itself"),
        ("n.yaml", {"n.yaml": INCLUDED + "include: a.yaml\n", "a.yaml": INCLUDED}, "do not nest"),
        ("bad.yaml", {"bad.yaml": INCLUDED.replace("[1, 2]", "[1, -2]")}, "bad.yaml:8:"),
    ],
)
def test_include_errors_name_the_line(tmp_path, include, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    main = tmp_path / "main.yaml"
    main.write_text(f"name: m\nbackends: [flashmla]\ninclude: [{include}]\n")
    with pytest.raises(ScenarioError) as e:
        scenarios.load(main, known_backends=CATALOG)
    assert message in str(e.value)
    if "bad.yaml" not in message:  # the included file's own errors name its own line
        assert str(e.value).startswith(f"{main}:3: include[0]: ")


def test_flashmla_builds_scenario():
    path = ROOT / "scenarios/engines/flashmla_builds_sm90.yaml"
    sc = scenarios.load(path, known_backends=CATALOG)
    sm90 = {}
    for f in sorted((ROOT / "scenarios/sm90").glob("*.yaml")):
        sm90 |= {c.case_id: c for c in scenarios.load(f, known_backends=CATALOG).cases}
    attention = {k for k, c in sm90.items() if c.op in ("decode", "prefill")}
    assert {c.case_id for c in sc.cases} == attention  # the shipped sm90 attention set, once
    assert {i["name"]: i["options"]["lib"] for i in sc.instances} == {
        "flashmla-0.26": ".kernels/flashmla-vllm-0.26.0",
        "flashmla-0.33": ".kernels/flashmla-vllm-0.33.0",
    }
    assert sc.limits == []  # in flashmla_route_limits_sm90.yaml, run first


def test_route_limits_cover_both_builds_and_both_decode_routes():
    path = ROOT / "scenarios/engines/flashmla_route_limits_sm90.yaml"
    sc = scenarios.load(path, known_backends=CATALOG)
    searched = {(s.backend, s.base.route, s.base.model, s.base.num_heads) for s in sc.limits}
    for build in ("flashmla-0.26", "flashmla-0.33"):
        assert (build, "decode-kernel", "v4-flash", 64) in searched
        assert (build, "decode-mixed", "v3.2", 16) in searched  # vLLM's route: under 32 heads
    for s in sc.limits:  # the hi point of a mixed search lies past the predicted 58254
        assert s.lo < s.hi <= s.base.context_len and s.at(s.hi).tokens == s.hi


def test_crossover_covers_tp_chunks_and_routes():
    path = ROOT / "scenarios/engines/tp_route_crossover_sm90.yaml"
    sc = scenarios.load(path, known_backends=CATALOG)
    heads = {
        m: sorted({c.num_heads for c in sc.cases if c.model == m}) for m in ("v3.2", "v4-flash")
    }
    assert heads == {"v3.2": [8, 16, 32, 64, 128], "v4-flash": [4, 8, 16, 32, 64]}
    assert {c.tokens for c in sc.cases} == {1024, 2048, 4096, 8192, 16384}
    crash = [c for c in sc.cases if "expect-failure" in c.tags]
    assert {(c.route, c.tokens) for c in crash} == {("decode-kernel", 16384)} and len(crash) == 10
    assert all(c.context_len == 32768 for c in sc.cases)


def test_a_limit_one_apart_needs_no_step():
    text = HEAD + "limit: {axis: batch_size, lo: 11622, hi: 11623, backend: flashmla}\n"
    (search,) = load(text).limits
    assert (search.lo, search.hi, search.step) == (11622, 11623, 1)


def test_a_limit_lists_values_to_probe_inside_its_bracket():
    text = (
        HEAD
        + "limit: {axis: batch_size, lo: 1, hi: 64, step: 8, probe: [40, 20], backend: flashmla}\n"
    )  # noqa: E501
    (search,) = load(text).limits
    assert search.probe == (20, 40)  # in order, off the step's grid
    (plain,) = load(HEAD + "limit: {axis: batch_size, lo: 1, hi: 64, backend: flashmla}\n").limits
    assert plain.probe == ()


def test_the_context_limit_searches_probe_the_issues_161k():
    """vLLM 52339 reports the crash near 161K: every search whose bracket holds 161K probes it."""
    sc = scenarios.load(
        ROOT / "scenarios/failures/prefill_context_limit_sm90.yaml", known_backends=CATALOG
    )
    assert len(sc.limits) == 25
    assert all(s.lo < 161 * 1024 < s.hi and 161 * 1024 in s.probe for s in sc.limits)
    # every FlashMLA build searched to 1M with the issue's chunk
    to_1m = {s.backend for s in sc.limits if s.hi == 2**20 and s.base.tokens == 8192}
    assert {"flashmla-vllm-0.26.0", "flashmla-vllm-0.33.0", "flashmla-sgl-1.0.0"} <= to_1m


def test_a_limit_backend_may_be_an_instance_of_its_own():
    known = {"flashmla": {"lib": None, "batch_invariant": False}, "torch": {}}
    text = HEAD + (
        "limit:\n  axis: batch_size\n  lo: 1\n  hi: 8\n"
        "  backend: {name: flashmla, as: flashmla-bi, batch_invariant: true}\n"
    )
    sc = load_scenario(text, known_backends=known)
    assert [s.backend for s in sc.limits] == ["flashmla-bi"]
    assert sc.backends == ["flashmla"]  # the search's instance runs no cases
    assert sc.instances == [
        {
            "name": "flashmla-bi",
            "base": "flashmla",
            "options": {"batch_invariant": True},
            "origin": sc.instances[0]["origin"],
        }
    ]
    bad = text.replace("batch_invariant: true", "invariant: true")
    with pytest.raises(ScenarioError, match="invariant"):
        load_scenario(bad, known_backends=known)
