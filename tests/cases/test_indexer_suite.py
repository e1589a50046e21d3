"""The `indexer` op in the suite: scenario rules and defaults, inputs, the oracle as a backend,
the Triton kernels through Triton's interpreter (tiny shapes), the DeepGEMM adapter against a
fake deep_gemm that follows its documented API, and a wrong top-k caught by selected scores."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.backends import Backend, Output, Prepared, Unsupported
from dsv4bench.backends.deepgemm import DeepGEMM
from dsv4bench.backends.torch_ref import TorchReference, oracle_call
from dsv4bench.cases import indexer_case, inputs
from dsv4bench.run import worker
from dsv4bench.scenarios import ScenarioError
from reference import indexer
from tests.factories import case_row, load_scenario, part, serving_row, write_run

KNOWN = ("torch", "triton", "deepgemm")

SCENARIO = """
name: ix
op: indexer
backends: [torch]
cases:
  - model: [v3.2, v4-flash]
    context_len: 256
    batch_size: 2
    s_q: 2
  - model: v4-flash
    context_len: 256
    tokens: 8
limit:
  axis: context_len
  lo: 256
  hi: 1024
  backend: torch
  model: v3.2
  tokens: 16
"""


def test_scenario_defaults_are_the_indexers() -> None:
    sc = load_scenario(SCENARIO, KNOWN)
    v32, flash, chunk = sc.cases
    assert (v32.num_heads, v32.topk, v32.compress_ratio, v32.page_size) == (64, 2048, 0, 64)
    assert (flash.num_heads, flash.topk, flash.compress_ratio, flash.window) == (64, 512, 4, 0)
    assert not flash.sink and flash.extra_topk == 0
    assert chunk.tokens == 8 and chunk.query_tokens == 8 and "-t8-" in chunk.case_id
    assert sc.limits[0].at(1024).context_len == 1024
    assert indexer_case.keys(flash) == 64 and indexer_case.logits_bytes(flash) == 4 * 64 * 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("tokens: 8\n        batch_size: 2", "is one request"),
        ("route: decode-kernel", "only prefill has route"),
        ("tokens: 512", "expected tokens <= context_len"),
        ("page_size: 48", "power of two"),
    ],
)
def test_scenario_rejects(extra: str, message: str) -> None:
    text = f"""
    name: bad
    op: indexer
    backends: [torch]
    cases:
      - model: v3.2
        context_len: 256
        {extra}
    """
    with pytest.raises(ScenarioError, match=message):
        load_scenario(text, KNOWN)


def _tiny(**kw):
    """Tiny cases: 16 heads so the interpreter is quick; small top-k to exercise selection."""
    text = f"""
    name: tiny
    op: indexer
    backends: [torch]
    defaults:
      num_heads: 16
      topk: 24
    cases:
      - model: {kw.get("model", "v3.2")}
        context_len: {kw.get("context_len", 150)}
        {kw.get("extra", "batch_size: 2")}
    """
    return load_scenario(text, KNOWN).cases[0]


CASES = {
    "paged-v32": dict(model="v3.2", extra="batch_size: 2\n        s_q: 2"),
    "paged-v4-2d": dict(model="v4-flash", context_len=300, extra="batch_size: 2\n        s_q: 3"),
    "ragged-v4": dict(model="v4-flash", context_len=300, extra="tokens: 10"),
    "ragged-v32": dict(model="v3.2", extra="tokens: 9"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_inputs_and_oracle(name: str) -> None:
    case = _tiny(**CASES[name])
    x = inputs.make_inputs(case, "cpu")
    out = oracle_call(case, x)()
    rows, n = indexer_case.rows(case), indexer_case.keys(case)
    assert out.out.shape == (rows, n) and out.topk.shape == (rows, case.topk)
    visible = torch.isfinite(out.out).sum(1)
    if case.tokens:
        assert torch.equal(visible, x["ke"].long())
    else:
        want = indexer.paged_visible(x["context_lens"], case.s_q)
        assert torch.equal(visible, want)
    assert ((out.topk >= 0).sum(1) == visible.clamp(max=case.topk)).all()


@pytest.mark.parametrize("name", ["paged-v32", "ragged-v4"])
def test_torch_backend_row_is_ok_with_topk_figures(name: str) -> None:
    case = _tiny(**CASES[name])
    row, prepared = worker.check(case, TorchReference(), "cpu", worker.Cache())
    assert row["status"] == "ok", row["message"]
    assert row.get("accuracy") is None and row["info"]["reference_row"]  # the oracle itself
    judged = TorchReference()
    judged.is_oracle = False  # the oracle's answer judged as a kernel's: the top-k figures
    row, _ = worker.check(case, judged, "cpu", worker.Cache())
    assert row["accuracy"]["topk_matched"] == 1.0 and row["accuracy"]["cos_diff"] == 0.0


class _OffByOne(Backend):
    """The oracle's logits, but each row's last top-k pick replaced by a worse key."""

    name = "off-by-one"
    archs = ("cpu",)
    ops = ("indexer",)

    def prepare(self, case, x, device):
        def run():
            o = oracle_call(case, x)()
            worse = indexer.topk_indices(o.out, case.topk + 1)[:, -1]
            topk = o.topk.clone()
            topk[:, -1] = torch.where(worse >= 0, worse, topk[:, -1])
            return Output(o.out, None, topk)

        return Prepared(run=run)


def test_a_worse_pick_makes_the_row_incorrect() -> None:
    case = _tiny(**CASES["paged-v32"])
    row, _ = worker.check(case, _OffByOne(), "cpu", worker.Cache())
    assert row["status"] == "incorrect"
    assert "top-k scores match" in row["message"]
    assert row["accuracy"]["topk_matched"] < 1.0


triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")


@pytest.mark.parametrize("name", list(CASES))
def test_triton_kernels_match_the_oracle_in_the_interpreter(name: str) -> None:
    from dsv4bench.backends.triton import indexer as triton_indexer
    from dsv4bench.measure.metrics import accuracy
    from dsv4bench.measure.topk import compare_topk

    case = _tiny(**CASES[name])
    x = inputs.make_inputs(case, "cpu")
    want = oracle_call(case, x)()
    p = triton_indexer.prepare(case, x, "cpu")
    assert p.info["dot"] == "fp32" and p.info["logits_bytes"] == indexer_case.logits_bytes(case)
    p.poison()
    got = p.finish(p.run())
    acc = accuracy(want, got)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 1e-12, acc
    top = compare_topk(want.out, want.topk, got.topk)
    assert top["topk_matched"] == 1.0 and top["topk_invalid"] == 0


def test_triton_ragged_tiles_no_row_sees_are_written_minus_inf() -> None:
    """16 x 16 tiles: the programs past the causal diagonal of the last rows skip the dot and
    write -inf; every logit still equals the oracle's."""
    from dsv4bench.backends.triton import indexer as triton_indexer

    case = _tiny(model="v3.2", extra="tokens: 40")
    x = inputs.make_inputs(case, "cpu")
    want = oracle_call(case, x)().out
    n = want.shape[1]
    ke = x["ke"].long()
    dead = [(r, c) for r in range(0, 40, 16) for c in range(0, n, 16)
            if int(ke[r: r + 16].max()) <= c]  # fmt: skip
    assert dead, "the case must have a tile no row of its program sees"
    launch, out = triton_indexer.ragged_launcher(
        x["q"], (x["kv"], x["kv_scales"]), x["weights"], x["ks"], x["ke"],
        tiles=dict(BLOCK_Q=16, BLOCK_N=16))  # fmt: skip
    out.fill_(float("nan"))
    got = launch()
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-4)  # sum order only


class _FakeDeepGEMM:
    """deep_gemm's documented indexer API, computed by the oracle; records its calls."""

    __version__ = "fake"

    def __init__(self):
        self.calls = []

    def get_num_sms(self):
        return 132

    def get_paged_mqa_logits_metadata(self, context_lens, num_sms):
        self.calls.append(("metadata", num_sms))
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def fp8_paged_mqa_logits(self, q, kv, w, lens, table, sched, max_len, clean_logits):
        assert kv.dtype == torch.uint8 and sched.shape == (133, 2) and clean_logits
        self.calls.append(("paged", max_len))
        return indexer.paged_mqa_logits(q, kv, w, lens, table, max_len)

    def fp8_mqa_logits(self, q, kv, w, ks, ke):
        self.calls.append(("ragged", kv[0].shape[0]))
        return indexer.mqa_logits(q, kv, w, ks, ke)


@pytest.mark.parametrize("name", ["paged-v4-2d", "ragged-v32"])
def test_deepgemm_adapter_calls_the_documented_api(name: str) -> None:
    fake = _FakeDeepGEMM()
    case = _tiny(**CASES[name])
    row, p = worker.check(case, DeepGEMM(fake), "cpu", worker.Cache())
    assert row["status"] == "unsupported"  # archs sm90/sm100: the CPU is refused first
    x = inputs.make_inputs(case, "cpu")
    p = DeepGEMM(fake).prepare(case, x, "cpu")
    got = p.finish(p.run())
    assert got.out.shape == (indexer_case.rows(case), indexer_case.keys(case))
    kinds = [c[0] for c in fake.calls]
    assert kinds == (["metadata", "paged"] if not case.tokens else ["ragged"])


def test_deepgemm_absent_is_unsupported_with_the_reason(monkeypatch) -> None:
    from dsv4bench.backends import deepgemm

    def broken(name):
        raise ImportError(f"{name}/_C.so: undefined symbol: _ZN3c10 (torch ABI)")

    monkeypatch.setattr(deepgemm.importlib, "import_module", broken)
    with pytest.raises(Unsupported, match="DeepGEMM not importable.*torch ABI"):
        DeepGEMM().provider()


def test_serving_adds_the_indexer_of_indexer_layers_only() -> None:
    from dsv4bench.serving import aggregate, plan, spec_from_dict

    base = {"model": "v4-flash", "prompt_lens": [8192], "chunk_sizes": [4096]}
    base |= {"batch_sizes": [1], "contexts": [8192], "helper_backends": ["triton"]}
    without = plan(spec_from_dict(base))
    p = plan(spec_from_dict({**base, "indexer": True}))
    ix_cases = [c for c in p.cases if c.op == "indexer"]
    assert not [c for c in without.cases if c.op == "indexer"]
    # two chunks (context 4096, 8192) and one decode step: 3 distinct indexer cases
    assert len(ix_cases) == 3 and all(p.backends_for(c) == ("triton",) for c in ix_cases)
    ttft = next(pt for pt in p.points() if pt.metric == "ttft" and pt.route == "sparse-prefill")
    ix_parts = [piece for piece in ttft.parts if piece.role == "indexer"]
    assert [piece.multiplicity for piece in ix_parts] == [21, 21]  # V4-Flash: 21 C4 layers
    # the same case ids as an indexer scenario's points: its rows serve the serving model
    sc = load_scenario(
        "name: s\nop: indexer\nbackends: [triton]\ncases:\n"
        "  - model: v4-flash\n    tokens: 4096\n    context_len: 8192\n",
        KNOWN,
    )
    assert sc.cases[0].case_id in {c.case_id for c in ix_cases}
    # aggregate: the indexer's time lands in breakdown_ms["indexer"]
    rows = [
        case_row(
            c.case_id,
            "flashmla" if c.op in ("prefill", "decode") else "triton",
            1.0 if c.op != "indexer" else 0.5,
        )
        for c in p.cases
    ]
    out = [r for r in aggregate(p, rows) if r["case_id"] == ttft.point_id]
    assert out and out[0]["status"] == "ok"
    assert out[0]["breakdown_ms"]["indexer"] == 0.5 * 42
    assert "indexer" in out[0]["label"]


def test_report_shows_the_indexer_share(tmp_path) -> None:
    from dsv4bench.report import build_report

    rows = []
    for x, ix in ((8192, 1.0), (65536, 6.0)):
        r = serving_row(
            "ttft",
            "flashmla",
            10.0 + ix,
            [part(f"p-{x}", "flashmla")],
            case_id=f"ttft-{x}",
            route="sparse-prefill",
            prompt_len=x,
            chunk_size=4096,
            batch_size=1,
        )
        r["breakdown_ms"] = {"attention": 10.0, "dequant": 0.0, "remap": 0.0, "indexer": ix}
        rows.append(r)
    rows.append(
        serving_row(
            "tpot",
            "flashmla",
            1.0,
            [part("d", "flashmla")],
            case_id="t",
            route="decode",
            batch_size=1,
            context_len=8192,
        )
    )
    files = build_report([write_run(tmp_path / "run", rows)], tmp_path / "out")
    assert "indexer-share.png" in {f.name for f in files}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "the lightning indexer's share" in md
    assert "37.5%" in md and "9.1%" in md  # 6 / 16 and 1 / 11
