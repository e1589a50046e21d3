"""The serving model: chunking, layer kinds, case sharing, routing and aggregation (CPU, fast)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bench import scenarios
from dsv4bench import serving as sv
from dsv4bench.cases.case import OPS, Case
from dsv4bench.scenarios import ScenarioError
from dsv4bench.serving import planning as sv_plan
from reference.models import MODELS
from tests.factories import case_row

K = 1024
BOTH = ["sparse-prefill", "decode-kernel"]


def _spec(**kw) -> sv.ServingSpec:
    d = {"model": "v4-flash", "backends": ["kern"]}
    d.update(kw)
    return sv.spec_from_dict(d)


# ---- models and chunking ----------------------------------------------------------------


@pytest.mark.parametrize(
    "model, kinds",
    [
        ("v4-flash", {"window": 2, "c4": 21, "c128": 20}),
        ("v4-pro", {"c128": 31, "c4": 30}),
        ("v3.2", {"dense-topk": 61}),
    ],
)
def test_layer_multiplicities(model, kinds):
    assert MODELS[model].layer_kinds() == kinds
    # one decode step: every layer counted once, each kind's case with its layer count
    p = sv.plan(_spec(model=model, batch_sizes=[4], contexts=[8 * K]))
    (point,) = p.points()
    by_id = {c.case_id: c for c in p.cases}
    assert sum(part.multiplicity for part in point.parts) == sum(kinds.values())
    assert sorted(part.multiplicity for part in point.parts) == sorted(kinds.values())
    for part in point.parts:
        assert by_id[part.case_id].op == "decode"


def test_chunks_last_shorter_and_positions():
    ch = sv.chunks(10_000, 4096)
    assert [(c.start, c.tokens, c.context_len) for c in ch] == [
        (0, 4096, 4096),
        (4096, 4096, 8192),
        (8192, 1808, 10_000),
    ]
    assert sv.chunks(100, 4096) == [sv.Chunk(0, 100)]
    assert [c.tokens for c in sv.chunks(8192, 4096)] == [4096, 4096]


@settings(deadline=None, max_examples=50)
@given(st.integers(1, 300_000), st.integers(16, 70_000))
def test_chunks_cover_prompt(L, C):
    ch = sv.chunks(L, C)
    assert ch[0].start == 0 and ch[-1].context_len == L
    assert all(a.context_len == b.start for a, b in zip(ch, ch[1:], strict=False))
    assert all(c.tokens == C for c in ch[:-1]) and 0 < ch[-1].tokens <= C
    assert len(ch) == -(-L // C)


def test_point_chunks_follow_prompt():
    p = sv.plan(_spec(prompt_lens=[10_000], chunk_sizes=[4096], routes=["sparse-prefill"]))
    (point,) = p.points()
    assert point.chunks == [
        (4096, 4096, "sparse-prefill"),
        (4096, 8192, "sparse-prefill"),
        (1808, 10_000, "sparse-prefill"),
    ]
    prefill = [c for c in p.cases if c.op == "prefill"]
    assert {(c.tokens, c.context_len) for c in prefill} == {(t, ctx) for t, ctx, _ in point.chunks}


# ---- widths of early chunks -------------------------------------------------------------


def test_visible_entries_and_widths_early_chunks():
    assert sv.visible_entries(1000, 4) == 250 and sv.visible_entries(1000, 128) == 7
    assert sv.window_span(4096, 4096, 128) == 4096  # first chunk: nothing before it
    assert sv.window_span(4096, 8192, 128) == 4096 + 127
    b = sv_plan._Builder(_spec(prompt_lens=[1], chunk_sizes=[1]))
    # C4: 1000 // 4 = 250 visible -> 256 wide (< index_topk 512); 8192 // 4 = 2048 -> 512
    assert b.widths("c4", 1000)["extra_topk"] == 256
    assert b.widths("c4", 8192)["extra_topk"] == 512
    # C128: all visible entries, rounded up to 64, at least 64
    assert b.widths("c128", 1000)["extra_topk"] == 64
    assert b.widths("c128", 64 * 128 + 1)["extra_topk"] == 64
    assert b.widths("c128", 65 * 128)["extra_topk"] == 128
    assert b.widths("c128", 128 * K)["extra_topk"] == 1024
    assert b.widths("window", 1000) == {
        "topk": 128,
        "window": 128,
        "sink": True,
        "extra_topk": 0,
        "compress_ratio": 0,
    }
    # sparse prefill: exact counts (its inputs pad the merged width to 128); nothing visible
    # in a compressed cache: no extra cache
    assert b.widths("c4", 1000, aligned=False)["extra_topk"] == 250
    assert b.widths("c128", 1000, aligned=False)["extra_topk"] == 7
    assert b.widths("c128", 100, aligned=False)["extra_topk"] == 0
    assert b.widths("c128", 100)["extra_topk"] == 0
    assert b.widths("window", 100, aligned=False)["topk"] == 100
    assert b.widths("window", 100)["topk"] == 128
    full = sv_plan._Builder(_spec(prompt_lens=[1], chunk_sizes=[1], topk_padding="full"))
    assert full.widths("c4", 1000)["extra_topk"] == 512
    v32 = sv_plan._Builder(_spec(model="v3.2", prompt_lens=[1], chunk_sizes=[1]))
    assert v32.widths("dense-topk", 1000)["topk"] == 1024
    assert v32.widths("dense-topk", 100)["topk"] == 128
    assert v32.widths("dense-topk", 64 * K)["topk"] == 2048
    assert v32.widths("dense-topk", 1000, aligned=False)["topk"] == 1000


def test_route_widths_in_plan():
    p = sv.plan(_spec(prompt_lens=[12 * K], chunk_sizes=[4096], routes=BOTH))
    by = {(c.route, c.context_len, c.compress_ratio): c for c in p.cases if c.op == "prefill"}
    # 12288 // 128 = 96 entries: exact on sparse prefill, 128 wide on the decode kernel
    assert by[("sparse-prefill", 12 * K, 128)].extra_topk == 96
    assert by[("decode-kernel", 12 * K, 128)].extra_topk == 128
    assert by[("sparse-prefill", 12 * K, 4)].extra_topk == 512


# ---- sharing ----------------------------------------------------------------------------


def test_distinct_cases_measured_once():
    p = sv.plan(
        _spec(
            prompt_lens=[4 * K, 8 * K, 16 * K],
            chunk_sizes=[4096, 8192],
            routes=["sparse-prefill", "decode-kernel"],
            batch_sizes=[1, 2],
            contexts=[8 * K],
        )
    )
    ids = [c.case_id for c in p.cases]
    assert len(ids) == len(set(ids))
    parts = [part for point in p.points() for part in point.parts]
    assert len(p.cases) < len(parts)
    assert {part.case_id for part in parts} == set(ids)  # nothing planned that is unused
    # the first chunk (4096 tokens at 4096) belongs to every L with C = 4096: one case
    first = [
        c
        for c in p.cases
        if c.op == "prefill"
        and c.tokens == 4096
        and c.context_len == 4096
        and c.compress_ratio == 4
        and c.route == "sparse-prefill"
    ]
    assert len(first) == 1
    users = [pt.point_id for pt in p.points() if first[0].case_id in {x.case_id for x in pt.parts}]
    assert len(users) >= 3  # L = 4K, 8K, 16K at C = 4096 (and L = 4K at C = 8192)


def test_every_case_is_sane():
    scenarios = pytest.importorskip("dsv4bench.scenarios")
    for model in [name for name, m in MODELS.items() if m.layers_known]:
        cfg = MODELS[model]
        spec = _spec(
            model=model,
            prompt_lens=[100, 1000, 4 * K, 10_000],
            chunk_sizes=[64, 1024, 4096],
            routes=["sparse-prefill", "decode-kernel"],
            batch_sizes=[1, 64],
            contexts=[256, 1000, 8 * K],
        )
        p = sv.plan(spec)
        for c in p.cases:
            assert c.op in OPS and "serving" in c.tags
            assert c.page_size == cfg.page_size and c.layout == cfg.cache_layout
            assert c.num_heads == cfg.num_heads and c.model == model
            assert Case.from_dict(c.to_dict()).case_id == c.case_id
            problem = scenarios.validate_case(c)
            on_decode_kernel = c.op == "decode" or c.route == "decode-kernel"
            if not on_decode_kernel:  # sparse prefill, dequant, remap: every scenario rule holds
                assert problem is None, (c.case_id, problem)
                continue
            # the decode kernel: widths multiples of 64, at most visible rounded up to 64
            assert c.topk % 64 == 0 and c.extra_topk % 64 == 0 and c.topk > 0
            assert c.topk <= min(cfg.window or cfg.index_topk, sv.align(c.context_len))
            assert c.sink == cfg.has_sink and c.window == cfg.window
            entries = c.context_len // c.compress_ratio if c.compress_ratio else 0
            assert c.extra_topk <= (sv.align(entries) if c.compress_ratio else 0)
            if c.context_len % 64 == 0 and entries % 64 == 0:
                assert problem is None, (c.case_id, problem)
            elif problem is not None:  # only the padding rules may break
                assert problem.startswith(("topk", "extra_topk")), problem
            if c.op == "prefill":
                assert 0 < c.tokens <= c.context_len and c.route in sv.BASE_ROUTES


def test_heads_per_rank_and_overrides():
    p = sv.plan(_spec(tp=8, batch_sizes=[1], contexts=[8 * K], page_size=64))
    assert {c.num_heads for c in p.cases} == {8}
    assert {c.page_size for c in p.cases} == {64}
    assert p.points()[0].point_id == "tpot-v4-flash-h8-B1-S8192"


# ---- routing ----------------------------------------------------------------------------


def test_threshold_routing():
    assert sv.chunk_route("threshold:11673", 11673) == "decode-kernel"
    assert sv.chunk_route("threshold:11673", 11674) == "sparse-prefill"
    assert sv.chunk_route("safe", 8192, safe_limit=8192) == "decode-kernel"
    assert sv.chunk_route("safe", 8193, safe_limit=8192) == "sparse-prefill"
    assert sv.chunk_route("decode-kernel", 10**6) == "decode-kernel"
    with pytest.raises(ValueError, match="safe_limit"):
        sv.chunk_route("safe", 1)

    p = sv.plan(
        _spec(prompt_lens=[40_000], chunk_sizes=[16 * K], routes=["threshold:11673", "safe"]),
        safe_limit=7000,
    )
    thr, safe = p.points()
    # chunks 16384, 16384, 7232: only the last one fits under either threshold
    assert [r for *_, r in thr.chunks] == ["sparse-prefill", "sparse-prefill", "decode-kernel"]
    assert [r for *_, r in safe.chunks] == ["sparse-prefill"] * 3
    assert thr.threshold == 11673 and safe.threshold == 7000
    assert thr.point_id == "ttft-v4-flash-L40000-C16384-threshold-11673"
    ops = {c.case_id: c for c in p.cases}
    routes = {ops[x.case_id].route for x in thr.parts if x.role == "attention"}
    assert routes == {"sparse-prefill", "decode-kernel"}


def test_routes_share_cases():
    base = dict(prompt_lens=[32 * K], chunk_sizes=[8 * K, 16 * K])
    pure = sv.plan(_spec(routes=["sparse-prefill", "decode-kernel"], **base))
    mixed = sv.plan(_spec(routes=["sparse-prefill", "decode-kernel", "threshold:11673"], **base))
    assert {c.case_id for c in mixed.cases} == {c.case_id for c in pure.cases}


def test_decode_route_has_no_dequant_or_remap():
    p = sv.plan(_spec(prompt_lens=[8 * K], chunk_sizes=[4096], routes=["decode-kernel"]))
    (point,) = p.points()
    assert {x.role for x in point.parts} == {"attention"}
    p = sv.plan(_spec(prompt_lens=[8 * K], chunk_sizes=[4096], routes=["sparse-prefill"]))
    (point,) = p.points()
    assert {x.role for x in point.parts} == {"attention", "dequant", "remap"}
    by_id = {c.case_id: c for c in p.cases}
    # window dequant: 4096 (first chunk) and 4096 + 127 tokens, once per layer per chunk
    window = {
        by_id[x.case_id].context_len: x.multiplicity for x in point.parts if x.role == "dequant"
    }
    assert window[4096] >= 43 and window[4096 + 127] == 43
    # compressed entries: C4 8192 // 4 = 2048 and C128 8192 // 128 = 64 entries at chunk 2
    assert window[2048] == 21 and window[64] == 20


def test_decode_mixed_route_takes_the_decode_kernel_as_one_request():
    base = dict(prompt_lens=[8 * K + 100], chunk_sizes=[4096])
    mixed = sv.plan(_spec(routes=["decode-mixed"], **base))
    kernel = sv.plan(_spec(routes=["decode-kernel"], **base))
    (point,) = mixed.points()
    assert {x.role for x in point.parts} == {"attention"}  # reads the FP8 cache: no dequant
    assert [r for _, _, r in point.chunks] == ["decode-mixed"] * 3
    for a, b in zip(mixed.cases, kernel.cases, strict=True):
        assert a.route == "decode-mixed" and a.decode_shape == (1, a.tokens)
        assert b.decode_shape == (b.tokens, 1)
        # the same decode kernel: index widths aligned to 64 on both decode routes
        assert (a.topk, a.extra_topk) == (b.topk, b.extra_topk) and a.extra_topk % 64 == 0
    assert {c.case_id for c in mixed.cases}.isdisjoint(c.case_id for c in kernel.cases)
    assert point.point_id.endswith("-decode-mixed") and point.dequant is None


def test_dequant_pool_reads_the_whole_window_pool():
    base = dict(prompt_lens=[8 * K], chunk_sizes=[4096])
    both = sv.plan(
        _spec(routes=["sparse-prefill", "decode-kernel"], dequant=["read", "pool"], **base)
    )
    by_id = {c.case_id: c for c in both.cases}
    pts = {(p.route, p.dequant): p for p in both.points()}
    # decode routes dequantize nothing: one curve; sparse-prefill: one per mode
    assert set(pts) == {
        ("sparse-prefill", "read"),
        ("sparse-prefill", "pool"),
        ("decode-kernel", None),
    }
    assert pts[("sparse-prefill", "pool")].point_id.endswith("-sparse-prefill-dqpool")
    assert pts[("sparse-prefill", "read")].point_id.endswith("-C4096-sparse-prefill")

    def window(point):  # window dequant sizes (the c4/c128 entries are < 4096 here)
        sizes = (by_id[x.case_id].context_len for x in point.parts if x.role == "dequant")
        return sorted(n for n in sizes if n >= 4096)

    # chunk 2 (positions 4096..8191): read = 4096 + 127 window tokens, pool = all 8192
    assert window(pts[("sparse-prefill", "read")]) == [4096, 4096 + 127]
    assert window(pts[("sparse-prefill", "pool")]) == [4096, 8192]
    # the attention and remap parts are the same cases
    same = lambda p: {x for x in p.parts if x.role != "dequant"}  # noqa: E731
    assert same(pts[("sparse-prefill", "read")]) == same(pts[("sparse-prefill", "pool")])
    # a threshold route sends long chunks to sparse-prefill: both modes
    thr = sv.plan(_spec(routes=["threshold:2048"], dequant=["pool", "read"], **base))
    assert [p.dequant for p in thr.points()] == ["pool", "read"]
    # the rows say which mode they sum
    per_token = lambda c: c.context_len / 1000 if c.op == "dequant" else 1.0  # noqa: E731
    rows = sv.aggregate(both, _rows_for(both, per_token))
    assert {(r["route"], r["dequant"]) for r in rows} == set(pts)
    pool = next(r for r in rows if r["dequant"] == "pool")
    read = next(r for r in rows if r["dequant"] == "read")
    # the window dequant of chunk 2, 43 layers: 8192 instead of 4223 tokens
    extra = 43 * (8192 - 4223) / 1000
    assert pool["breakdown_ms"]["dequant"] - read["breakdown_ms"]["dequant"] == pytest.approx(extra)
    assert pool["breakdown_ms"]["attention"] == read["breakdown_ms"]["attention"]


@pytest.mark.parametrize("mode, mult", [("step", 1), ("layer", 20)])
def test_c128_index_build_once_per_step_or_per_layer(mode, mult):
    base = dict(batch_sizes=[4], contexts=[64 * K])
    plain = sv.plan(_spec(**base))
    built = sv.plan(_spec(c128_index=mode, **base))
    (p0,), (p1,) = plain.points(), built.points()
    assert p0.c128_index == "none" and p1.c128_index == mode
    extra = [x for x in p1.parts if x not in p0.parts]
    assert [(x.role, x.multiplicity) for x in extra] == [("remap", mult)]
    case = built.case(extra[0].case_id)
    # 4 queries x every visible C128 entry (65536 // 128 = 512) turned into global slots
    assert (case.op, case.s_q, case.topk, case.batch_size) == ("remap", 4, 512, 1)
    assert p1.point_id == f"tpot-v4-flash-c128{mode}-B4-S65536"
    rows = sv.aggregate(built, _rows_for(built, lambda c: 2.0 if c.op == "remap" else 1.0))
    (row,) = rows
    assert row["c128_index"] == mode and row["breakdown_ms"]["remap"] == pytest.approx(2.0 * mult)
    assert row["value_ms"] == pytest.approx(43 + 2.0 * mult)
    # no C128 layer (V3.2) or nothing visible yet: no part
    assert not any(
        x.role == "remap"
        for p in sv.plan(_spec(model="v3.2", c128_index=mode, **base)).points()
        for x in p.parts
    )
    short = sv.plan(_spec(c128_index=mode, batch_sizes=[4], contexts=[100]))
    assert not any(x.role == "remap" for x in short.points()[0].parts)


def test_envelope_takes_each_attention_part_from_its_fastest_backend():
    p = sv.plan(
        _spec(
            prompt_lens=[8 * K], chunk_sizes=[4096], routes=["sparse-prefill"], backends=["a", "b"]
        )
    )
    attention = [c for c in p.cases if c.op == "prefill"]
    fast_a = {attention[0].case_id}  # backend a wins one case, b every other
    rows = []
    for c in p.cases:
        if c.op == "prefill":
            rows.append(case_row(c.case_id, "a", 1.0 if c.case_id in fast_a else 5.0))
            rows.append(case_row(c.case_id, "b", 2.0))
        else:
            rows.append(case_row(c.case_id, "torch", 0.5))
    rows.append(case_row("x-not-in-plan", "torch", 0.001))
    out = {r["backend"]: r for r in sv.aggregate(p, rows)}
    assert set(out) == {"a", "b", sv.ENVELOPE}
    env = out[sv.ENVELOPE]
    used = {x["case_id"]: x["backend"] for x in env["parts"] if x["role"] == "attention"}
    assert all(used[cid] == ("a" if cid in fast_a else "b") for cid in used)
    assert env["value_ms"] < min(out["a"]["value_ms"], out["b"]["value_ms"])
    assert env["breakdown_ms"]["dequant"] == out["a"]["breakdown_ms"]["dequant"]
    # a crash on one backend: the envelope takes the other; crashed on both: the point fails
    crashed = attention[1].case_id
    for r in rows:
        if r["case_id"] == crashed and r["backend"] == "b":
            r.update(status="crash", timing=None)
    out = {r["backend"]: r for r in sv.aggregate(p, rows)}
    assert out["b"]["status"] == "crash" and out[sv.ENVELOPE]["status"] == "ok"
    for r in rows:
        if r["case_id"] == crashed:
            r.update(status="crash", timing=None)
    assert {r["backend"]: r["status"] for r in sv.aggregate(p, rows)}[sv.ENVELOPE] == "crash"
    # a torch row of an attention case is not one of the envelope's backends
    rows.append(case_row(crashed, "torch", 0.001))
    assert {r["backend"]: r["status"] for r in sv.aggregate(p, rows)}[sv.ENVELOPE] == "crash"
    # one backend: no envelope row
    one = sv.plan(_spec(prompt_lens=[4096], chunk_sizes=[4096], routes=["sparse-prefill"]))
    assert [r["backend"] for r in sv.aggregate(one, _rows_for(one, lambda c: 1.0))] == ["kern"]


def test_the_envelope_never_takes_the_oracle_a_spec_lists():
    """`backends: [a, b, torch]`: torch's serving rows are a baseline; the envelope's attention
    parts come from a and b even where torch is the fastest."""
    kw = dict(prompt_lens=[8 * K], chunk_sizes=[4096], routes=["sparse-prefill"])
    p = sv.plan(_spec(backends=["a", "b", "torch"], **kw))
    time = {"a": 2.0, "b": 3.0, "torch": 0.5}
    rows = [
        case_row(c.case_id, b, t)
        for c in p.cases
        for b, t in (time.items() if c.op == "prefill" else [("a", 1.0)])
    ]
    out = {r["backend"]: r for r in sv.aggregate(p, rows)}
    assert set(out) == {"a", "b", "torch", sv.ENVELOPE}
    used = {x["backend"] for x in out[sv.ENVELOPE]["parts"] if x["role"] == "attention"}
    assert used == {"a"} and out[sv.ENVELOPE]["value_ms"] == out["a"]["value_ms"]
    # one candidate beside the oracle: nothing to pick between, no envelope row
    one = sv.plan(_spec(backends=["a", "torch"], **kw))
    assert [r["backend"] for r in sv.aggregate(one, rows)] == ["a", "torch"]


def test_safe_needs_limit_and_limit_from_rows():
    with pytest.raises(ValueError, match="safe"):
        sv.plan(_spec(prompt_lens=[4096], chunk_sizes=[4096], routes=["safe"]))
    rows = [
        {
            "kind": "limit",
            "axis": "tokens",
            "last_ok": 11620,
            "backend": "kern",
            "params": {"op": "prefill", "route": "decode-kernel", "model": "v4-flash"},
        },
        {
            "kind": "limit",
            "axis": "batch_size",
            "last_ok": 11000,
            "backend": "kern",
            "params": {"op": "decode", "model": "v3.2"},
        },
        {
            "kind": "limit",
            "axis": "tokens",
            "last_ok": None,
            "first_fail": 1,
            "backend": "kern",
            "params": {"op": "prefill", "route": "decode-kernel", "model": "v4-flash"},
        },
        {
            "kind": "limit",
            "axis": "context_len",
            "last_ok": 5,
            "backend": "kern",
            "params": {"op": "decode", "model": "v4-flash"},
        },
    ]
    assert sv.safe_limit_from_rows(rows) == 11000
    assert sv.safe_limit_from_rows(rows, model="v4-flash") == 11620
    assert sv.safe_limit_from_rows(rows, backend="other") is None


# ---- aggregation ------------------------------------------------------------------------


def _rows_for(p: sv.ServingPlan, ms_of, backends=("kern",)) -> list[dict]:
    rows = []
    for c in p.cases:
        if c.op in ("prefill", "decode"):
            rows += [case_row(c.case_id, b, ms_of(c), env={"gpu": b}) for b in backends]
        else:
            rows.append(case_row(c.case_id, "torch", 10 * ms_of(c)))
            rows.append(case_row(c.case_id, "kern", ms_of(c)))  # faster helper wins
    return rows


def test_aggregate_sums_multiplicities():
    p = sv.plan(
        _spec(
            prompt_lens=[8 * K],
            chunk_sizes=[4096],
            routes=["sparse-prefill"],
            batch_sizes=[2],
            contexts=[8 * K],
        )
    )
    ms = {c.case_id: 0.001 * (i + 1) for i, c in enumerate(p.cases)}
    out = sv.aggregate(p, _rows_for(p, lambda c: ms[c.case_id]))
    assert len(out) == len(p.points())
    for row, point in zip(out, p.points(), strict=True):
        expect = sum(x.multiplicity * ms[x.case_id] for x in point.parts)
        assert row["status"] == "ok" and row["value_ms"] == pytest.approx(expect)
        assert row["kind"] == "serving" and row["label"] == sv.LABEL
        assert row["case_id"] == point.point_id and row["backend"] == "kern"
        assert sum(row["breakdown_ms"].values()) == pytest.approx(expect)
        assert row["env"] == {"gpu": "kern"}
        assert all(part["backend"] == "kern" for part in row["parts"])
    ttft, tpot = out
    assert ttft["metric"] == "ttft" and ttft["prompt_len"] == 8 * K and ttft["chunk_size"] == 4096
    assert ttft["case_id"] == "ttft-v4-flash-L8192-C4096-sparse-prefill"
    assert tpot["metric"] == "tpot" and tpot["batch_size"] == 2 and tpot["context_len"] == 8 * K


def test_aggregate_hand_sum():
    p = sv.plan(_spec(model="v3.2", batch_sizes=[1], contexts=[4096]))
    (case,) = p.cases
    out = sv.aggregate(p, [case_row(case.case_id, "kern", 0.5)])
    assert out[0]["value_ms"] == pytest.approx(61 * 0.5)
    assert out[0]["parts"] == [
        {
            "case_id": case.case_id,
            "multiplicity": 61,
            "role": "attention",
            "backend": "kern",
            "ms": 0.5,
            "status": "ok",
        }
    ]


def test_a_point_sums_the_timer_every_row_of_the_run_measured():
    """Makespans when every ok kernel row of the run has one, the events sum beside; one kernel
    row without puts the whole run on the events median. The oracle skips the profiler: its
    rows do not count, and its own points (no makespan) sum events and say so."""
    p = sv.plan(_spec(model="v3.2", batch_sizes=[1], contexts=[4096], backends=["kern", "torch"]))
    (case,) = p.cases
    fast = case_row(case.case_id, "kern", 0.5)
    fast["timing"]["profiler_ms"] = 0.4
    oracle = case_row(case.case_id, "torch", 9.0)
    out = {r["backend"]: r for r in sv.aggregate(p, [fast, oracle])}
    kern, torch = out["kern"], out["torch"]
    assert kern["value_ms"] == pytest.approx(61 * 0.4) and kern["timer"] == "profiler_ms"
    assert kern["events_ms"] == pytest.approx(61 * 0.5)
    assert kern["parts"][0]["ms"] == 0.4 and kern["parts"][0]["events_ms"] == 0.5
    assert torch["value_ms"] == torch["events_ms"] == pytest.approx(61 * 9.0)
    assert torch["timer"] == "median_ms" and torch["status"] == "ok"
    assert "events_ms" not in torch["parts"][0]  # its ms is the events median
    # a kernel row without a makespan: the run's points all sum events
    other = case_row(case.case_id, "other", 0.7)
    out = {r["backend"]: r for r in sv.aggregate(p, [fast, oracle, other])}
    kern = out["kern"]
    assert kern["value_ms"] == pytest.approx(61 * 0.5) and kern["timer"] == "median_ms"


def test_helper_parts_take_fastest_ok_row():
    p = sv.plan(_spec(prompt_lens=[4096], chunk_sizes=[4096], routes=["sparse-prefill"]))
    rows = []
    for c in p.cases:
        if c.op == "prefill":
            rows.append(case_row(c.case_id, "kern", 1.0))
        else:
            rows.append(case_row(c.case_id, "torch", 2.0))
            rows.append(case_row(c.case_id, "kern", None, status="unsupported"))
    (row,) = sv.aggregate(p, rows)
    assert row["status"] == "ok"
    helpers = [x for x in row["parts"] if x["role"] != "attention"]
    assert helpers and all(x["backend"] == "torch" and x["ms"] == 2.0 for x in helpers)


def test_failing_part_makes_point_null():
    p = sv.plan(_spec(prompt_lens=[64 * K], chunk_sizes=[32 * K], routes=["decode-kernel"]))
    rows = _rows_for(p, lambda c: 1.0)
    crashed = next(c for c in p.cases if c.op == "prefill" and c.context_len == 64 * K)
    for r in rows:
        if r["case_id"] == crashed.case_id:
            r.update(status="crash", timing=None, message="get_decoding_sched_meta.cu: error")
    (row,) = sv.aggregate(p, rows)
    assert row["value_ms"] is None and row["status"] == "crash"
    assert crashed.case_id in row["message"] and "sched_meta" in row["message"]
    bad = [x for x in row["parts"] if x["status"] != "ok"]
    assert [x["case_id"] for x in bad] == [crashed.case_id] and bad[0]["ms"] is None


def test_missing_rows_and_backends():
    p = sv.plan(_spec(batch_sizes=[1], contexts=[8 * K], backends=[]))
    rows = _rows_for(p, lambda c: 1.0, backends=("a", "b"))
    out = sv.aggregate(p, rows)
    assert [r["backend"] for r in out] == ["a", "b", sv.ENVELOPE]
    assert all(r["status"] == "ok" for r in out)
    out = sv.aggregate(p, rows[1:])  # drop one part of backend a
    assert out[0]["status"] == "missing" and out[0]["value_ms"] is None
    assert out[1]["status"] == "ok" and out[2]["status"] == "ok"  # the envelope takes b's
    # an ok row without timing does not count as a measurement
    rows[0]["timing"] = None
    assert sv.aggregate(p, rows)[0]["status"] == "missing"
    # a later row for the same (case, backend) (a rerun) replaces the earlier one
    rows.append(case_row(rows[0]["case_id"], "a", 1.0))
    assert sv.aggregate(p, rows)[0]["status"] == "ok"


def test_jobs_schedule_helpers_on_helper_backends():
    p = sv.plan(_spec(prompt_lens=[8 * K], chunk_sizes=[4096], routes=["sparse-prefill"]))
    pairs = {(c.case_id, b) for c, b in p.jobs()}
    for c in p.cases:
        want = {"torch"} if c.op in ("dequant", "remap") else {"kern"}
        assert {b for cid, b in pairs if cid == c.case_id} == want
    assert p.summary()["jobs"] == len(pairs)


# ---- spec parsing -----------------------------------------------------------------------


def test_spec_from_dict_parses_sizes_and_nested():
    spec = sv.spec_from_dict(
        {
            "op": "serving",
            "model": "v4-pro",
            "prompt_lens": ["4K", 8192],
            "chunk_sizes": 4096,
            "routes": ["threshold:11673", "safe"],
            "batch_sizes": [1, 2],
            "contexts": ["64k"],
            "timing": {"iters": 5},
            "tolerance": {"cos_diff": 1e-5},
        }
    )
    assert spec.prompt_lens == [4096, 8192] and spec.chunk_sizes == [4096]
    assert spec.contexts == [65536] and spec.timing.iters == 5
    assert spec.tolerance.cos_diff == 1e-5
    assert dataclasses.replace(spec).heads == 128
    # every field is a file key, but the instances its backend entries define
    assert set(sv.KEYS) >= {f.name for f in dataclasses.fields(sv.ServingSpec)} - {"instances"}


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"model": "v9"}, "model"),
        ({"prompt_lens": [4096]}, "chunk_sizes"),
        ({"prompt_lens": [0], "chunk_sizes": [1]}, "prompt_lens"),
        ({"prompt_lens": ["4Q"], "chunk_sizes": [1]}, "prompt_lens"),
        ({"prompt_lens": [1], "chunk_sizes": [1], "routes": ["fast"]}, "routes"),
        ({"prompt_lens": [1], "chunk_sizes": [1], "routes": ["threshold:x"]}, "routes"),
        ({"batch_sizes": [1], "contexts": [1], "tp": 3}, "tp"),
        ({"batch_sizes": [1], "contexts": [1], "layout": "v32"}, "layout"),
        ({"batch_sizes": [1], "contexts": [1], "topk_padding": "some"}, "topk_padding"),
        ({"batch_sizes": [1], "contexts": [1], "timing": {"iterz": 1}}, "timing"),
        ({"batch_sizes": [1], "contexts": [1], "colour": 1}, "colour"),
        ({"batch_sizes": [1], "contexts": [1], "op": "decode"}, "op"),
        ({"backends": ["x"]}, "nothing to build"),
        ({"prompt_lens": [1], "chunk_sizes": [1], "dequant": "all"}, "dequant"),
        ({"prompt_lens": [1], "chunk_sizes": [1], "dequant": []}, "dequant"),
        ({"batch_sizes": [1], "contexts": [1], "c128_index": "never"}, "c128_index"),
        ({"batch_sizes": [1], "contexts": [1], "c128_index": 1}, "c128_index"),
    ],
)
def test_spec_from_dict_rejects(bad, match):
    d = {"model": "v4-flash", **bad}
    with pytest.raises(ValueError, match=match):
        sv.spec_from_dict(d)


@pytest.mark.slow
def test_sampled_cases_build_and_run_on_the_oracle():
    """One case of every (op, route, layer kind) builds inputs and runs the oracle on a CPU."""
    from dsv4bench.cases import inputs
    from dsv4bench.cases.oracle import oracle_call

    for model in ("v4-flash", "v3.2"):
        spec = _spec(
            model=model,
            prompt_lens=[200],
            chunk_sizes=[128],
            routes=BOTH,
            batch_sizes=[2],
            contexts=[200],
            num_heads=8,
        )
        seen = {}
        for c in sv.plan(spec).cases:
            seen.setdefault((c.op, c.route, c.compress_ratio, c.extra_topk > 0), c)
        for c in seen.values():
            out = oracle_call(c, inputs.make_inputs(c, "cpu"))()
            assert out.out is not None, c.case_id


# ---- shipped serving scenarios ----------------------------------------------------------


SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in SCENARIOS.rglob("*.yaml") if scenarios.is_serving_text(p.read_text())),
    ids=lambda p: p.relative_to(SCENARIOS).as_posix(),
)
def test_shipped_serving_scenarios_load_and_plan(path):
    assert scenarios.is_serving_text(path.read_text())
    from dsv4bench import backends

    spec = scenarios.load_serving(path, known_backends=backends.catalog())
    jobs = sv.jobs_for(spec)
    assert jobs and {c.model for c, _ in jobs} == {spec.model}


def test_bad_serving_file_names_file_line_and_key(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("op: serving\nmodel: v4-flash\nbatch_sizes: [1, -2]\ncontexts: [8K]\n")
    with pytest.raises(ScenarioError) as e:
        scenarios.load_serving(bad, known_backends={"torch"})
    assert str(e.value).startswith(f"{bad}:3: batch_sizes:")
    bad.write_text(
        "op: serving\nmodel: v4-flash\nbatch_sizes: [1]\ncontexts: [8K]\nbackends: [nope]\n"
    )
    with pytest.raises(ScenarioError) as e:
        scenarios.load_serving(bad, known_backends={"torch"})
    assert str(e.value).startswith(f"{bad}:5: backends[0]:") and "nope" in str(e.value)


def test_shipped_ttft_scenario_shows_what_sglangs_threshold_costs():
    from dsv4bench import backends
    from dsv4bench.measure import hardware

    path = Path(__file__).resolve().parents[2] / "scenarios" / "serving" / "v4_flash_sm90.yaml"
    spec = scenarios.load_serving(path, known_backends=backends.catalog())
    limit = 11622  # the decode-route limit measured on sm90 (H100 and H200)
    between = [c for c in spec.chunk_sizes if limit < c <= hardware.SGLANG_DSV4_THRESHOLD]
    assert len(between) >= 2 and {"threshold:11673", "safe"} <= set(spec.routes)
    small = dataclasses.replace(
        spec,
        prompt_lens=[32 * K],
        chunk_sizes=between,
        routes=["threshold:11673", "safe"],
        backends=["kern"],
        helper_backends=["kern"],
    )
    p = sv.plan(small, safe_limit=limit)
    # the decode kernel dies above the limit (FlashMLA's scheduler); everything else runs
    rows = []
    for c in p.cases:
        crash = c.op == "prefill" and c.route == "decode-kernel" and c.tokens > limit
        status = "crash" if crash else "ok"
        rows.append(case_row(c.case_id, "kern", None if crash else 0.1, status))
    points = {(r["route"], r["chunk_size"]): r for r in sv.aggregate(p, rows)}
    for chunk in between:
        threshold, safe = points[("threshold:11673", chunk)], points[("safe", chunk)]
        assert threshold["status"] == "crash" and threshold["value_ms"] is None
        assert safe["status"] == "ok" and safe["value_ms"] > 0


def test_every_point_carries_its_routes_workspace():
    """The sparse-prefill route's largest one-layer workspace (V3.2: the chunk's context
    dequantized to bf16 rows and its tokens x 2048 remapped indices); the decode routes read
    the cache as it is (0); the C128 decode index build's indices on TPOT."""
    spec = _spec(model="v3.2", prompt_lens=[8 * K], chunk_sizes=[4096], routes=BOTH)
    p = sv.plan(dataclasses.replace(spec, batch_sizes=[4], contexts=[8 * K]))
    by_route = {pt.route: pt for pt in p.points()}
    prefill = 8 * K * 576 * 2 + 4096 * 2048 * 4  # the second chunk's
    assert by_route["sparse-prefill"].workspace_bytes == prefill
    assert by_route["decode-kernel"].workspace_bytes == by_route["decode"].workspace_bytes == 0
    rows = [case_row(c.case_id, "kern", 1.0) for c in p.cases]
    rows += [case_row(c.case_id, "torch", 2.0) for c in p.cases if c.op in ("dequant", "remap")]
    out = {(r["route"], r["status"]): r for r in sv.aggregate(p, rows)}
    assert out[("sparse-prefill", "ok")]["workspace_mib"] == round(prefill / 2**20, 3)
    assert out[("decode", "ok")]["workspace_mib"] == 0.0
    failed = sv.aggregate(p, rows[1:])  # a missing part: the point fails, its workspace stays
    assert all(r["workspace_mib"] is not None for r in failed)
    v4 = sv.plan(_spec(batch_sizes=[4], contexts=[8 * K], c128_index="step"))
    (tpot,) = v4.points()
    assert tpot.workspace_bytes == 4 * 64 * 4  # 8K // 128 = 64 entries for 4 queries, int32


def test_helper_parts_name_the_engine_kernel_they_sum_and_triton_stays_the_alternative():
    spec = _spec(model="v3.2", prompt_lens=[4096], chunk_sizes=[4096], routes=["sparse-prefill"])
    p = sv.plan(spec)
    kernels = {
        "dequant": ("vllm-ops-0.33.0", "vllm cp_gather_and_upconvert_fp8_kv_cache", "dequant_v32"),
        "remap": ("vllm-triton-0.33.0", "vllm triton_convert_req_index_to_global_index", "remap"),
    }
    rows = []
    for c in p.cases:
        if c.op == "prefill":
            rows.append(case_row(c.case_id, "kern", 1.0))
            continue
        engine, kernel, own = kernels[c.op]
        rows.append(case_row(c.case_id, engine, 0.5, info={"kernel": kernel}))
        rows.append(case_row(c.case_id, "triton", 0.7, info={"kernel": own}))
    (row,) = sv.aggregate(p, rows)  # helper_backends as a spec lists: the fastest, the engine's
    took = {
        x["role"]: (x["backend"], x["kernel"]) for x in row["parts"] if x["role"] != "attention"
    }
    assert took == {op: (engine, kernel) for op, (engine, kernel, _) in kernels.items()}
    alternative = [r for r in rows if r["backend"] in ("kern", "triton")]
    (row,) = sv.aggregate(p, alternative)
    took = {
        x["role"]: (x["backend"], x["kernel"]) for x in row["parts"] if x["role"] != "attention"
    }
    assert took == {op: ("triton", own) for op, (_, _, own) in kernels.items()}


def test_decode_remap_adds_vllms_per_step_remap_to_the_decode_routes_and_tpot():
    base = dict(model="v3.2", prompt_lens=[8 * K], chunk_sizes=[4096], batch_sizes=[32])
    base |= dict(contexts=[8 * K], routes=["decode-mixed", "sparse-prefill"])
    off = sv.plan(_spec(**base))
    on = sv.plan(_spec(**base, decode_remap=True))
    assert not [x for x in off.points() if x.route != "sparse-prefill" for x in x.parts
                if x.role == "remap"]  # fmt: skip
    by_route = {pt.route: pt for pt in on.points()}
    (tpot,) = [x for x in by_route["decode"].parts if x.role == "remap"]
    case = on.case(tpot.case_id)
    assert (tpot.multiplicity, case.query_tokens, case.topk) == (61, 32, 2048)
    assert by_route["decode"].workspace_bytes == 32 * 2048 * 4
    chunks = [on.case(x.case_id) for x in by_route["decode-mixed"].parts if x.role == "remap"]
    assert sorted((c.query_tokens, c.topk) for c in chunks) == [(4096, 2048)]  # both chunks
    same = {p.case_id for p in by_route["sparse-prefill"].parts} == {
        p.case_id for p in next(x for x in off.points() if x.route == "sparse-prefill").parts
    }
    assert same  # the sparse-prefill route already paid its remap
    with pytest.raises(ValueError, match="decode_remap: modelled for V3.2's top-k layers"):
        _spec(batch_sizes=[1], contexts=[4096], decode_remap=True)
    with pytest.raises(ValueError, match="decode_remap: expected true or false"):
        _spec(model="v3.2", batch_sizes=[1], contexts=[4096], decode_remap="yes")
