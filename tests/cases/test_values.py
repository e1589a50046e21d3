"""Case.values: how q and the cache's latent are drawn. `normal` is what the suite always drew
(the committed smoke rows' inputs are unchanged); `outliers` has what cases/values.py claims (a
few heavy-tailed channels of each tensor, some past e4m3's 448, the other tensor small there, a
larger RoPE part), drawn deterministically, and the oracle still agrees with the independent
float64 reference on it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dsv4bench import backends, scenarios
from dsv4bench.cases import inputs, values
from dsv4bench.run import worker
from reference.layouts import E4M3_MAX
from tests.factories import V4, V32, make_case

ROOT = Path(__file__).resolve().parents[2]
V32_PREFILL = dict(V32, op="prefill", num_heads=64, tokens=64, topk=512, context_len=2048)
V4_DECODE = dict(V4, op="decode", num_heads=64, batch_size=2, topk=128, window=128,
                 extra_topk=128, compress_ratio=4, context_len=2048, sink=True)  # fmt: skip


def test_normal_values_are_the_inputs_the_committed_smoke_rows_were_made_from():
    sc = scenarios.load(ROOT / "scenarios" / "smoke.yaml", known_backends=backends.names())
    rows = [json.loads(line) for line in (ROOT / "results/cpu/smoke/results.jsonl").open()]
    stored = {r["case_id"]: r["input_fingerprint"] for r in rows if r.get("input_fingerprint")}
    cases = [c for c in sc.cases if c.op in ("decode", "prefill") and c.case_id in stored][:4]
    assert cases and all(c.values == "normal" and "values" not in c.params() for c in cases)
    for case in cases:
        assert inputs.fingerprint(inputs.make_inputs(case, "cpu")) == stored[case.case_id]


def _outliers(shape=V32_PREFILL, **fields):
    case = make_case(shape, values="outliers", **fields)
    return case, inputs.make_inputs(case, "cpu")


def test_outliers_have_the_channels_the_distribution_claims():
    case, x = _outliers()
    q, kv = x["q"].float().reshape(-1, case.d_qk), x["kv"].float()[:, 0]
    kv = kv[torch.isfinite(kv).all(1)]  # the slots no index names are NaN
    q_own, kv_own = values.outlier_channels(case.d_qk, case.seed)
    rope = slice(case.d_qk - values.ROPE_DIM, None)
    for t, own, other in ((q, q_own, kv_own), (kv, kv_own, q_own)):
        std = t.std(0)
        top = std[: case.d_qk - values.ROPE_DIM].topk(values.OUTLIER_CHANNELS).indices
        assert set(top.tolist()) == set(own.tolist())  # the largest NoPE channels are its own
        plain = torch.ones(case.d_qk, dtype=torch.bool)
        plain[own], plain[other], plain[rope] = False, False, False
        assert std[plain].mean() == pytest.approx(1.0, rel=0.15)
        assert std[rope].mean() == pytest.approx(values.ROPE_SCALE, rel=0.15)
        assert std[other].mean() < 4 / values.OUTLIER_SCALE  # small where the other is large
        assert (t[:, own].abs() > E4M3_MAX).any()  # saturates an e4m3 cast at scale 1
        assert not (t[:, plain].abs() > E4M3_MAX).any()
    # heavy tails: far more mass past 5 sigma than a normal channel of the same spread has
    tail = (q[:, q_own].abs() > 5 * q[:, q_own].std(0)).float().mean()
    assert tail > 1e-3


def test_student_t_has_its_tail():
    g = torch.Generator().manual_seed(0)
    t = values.student_t(values.OUTLIER_DF, (400_000,), g, "cpu")
    assert (t.abs() > 7).float().mean() == pytest.approx(0.0022, rel=0.25)  # t(4): P = 0.22 %


def test_outliers_are_deterministic_and_seeded():
    case, a = _outliers()
    _, b = _outliers()
    assert inputs.fingerprint(a) == inputs.fingerprint(b)
    other = inputs.make_inputs(replace(case, seed=1), "cpu")
    assert inputs.fingerprint(other) != inputs.fingerprint(a)
    normal = make_case(V32_PREFILL)
    assert normal.case_id != case.case_id and "values" in case.params()
    assert not torch.equal(values.outlier_channels(576, 0)[0], values.outlier_channels(576, 1)[0])


@pytest.mark.parametrize("shape", [V32_PREFILL, V4_DECODE], ids=["v32-prefill", "v4-decode"])
def test_the_oracle_agrees_with_the_float64_reference_on_outliers(shape):
    case, _ = _outliers(shape, tokens=16) if shape is V32_PREFILL else _outliers(shape)
    backends.setup([])
    row, _ = worker.check(case, backends.get("reference-f64"), "cpu", worker.Cache())
    assert row["status"] == "ok", row["message"]
    assert row["accuracy"]["cos_diff"] <= case.tolerance.cos_diff


def test_values_is_an_axis_of_attention_cases_only():
    text = """
    name: t
    op: {op}
    backends: [torch]
    cases:
      - model: v3.2
        context_len: 4096
        values: [normal, outliers]
    """
    sc = scenarios.load_text(text.format(op="prefill"), "t.yaml", known_backends=("torch",))
    assert [c.values for c in sc.cases] == ["normal", "outliers"]
    with pytest.raises(scenarios.ScenarioError, match="values outliers needs an op with q"):
        scenarios.load_text(text.format(op="indexer"), "t.yaml", known_backends=("torch",))
    bad = text.format(op="prefill").replace("outliers", "lognormal")
    with pytest.raises(scenarios.ScenarioError, match="unknown value distribution"):
        scenarios.load_text(bad, "t.yaml", known_backends=("torch",))
