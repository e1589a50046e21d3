"""The indexer's time split into its logits and its top-k within one row: every indexer
backend hands the worker its logits alone (Prepared.logits: the call without its top-k, the
same logits the call returns), the worker times them as it times the call, and the row keeps
logits_ms and topk_ms = the call's time minus the logits, per timer, adding up to it."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.backends.deepgemm import DeepGEMM
from dsv4bench.backends.torch_ref import TorchReference
from dsv4bench.cases import indexer_case, inputs
from dsv4bench.measure import split, timing
from dsv4bench.run import worker
from tests.backends.test_deepgemm_backend import PAGED, FakeDeepGEMM, FakeDeepGEMM28, _case

RAGGED = ("v3.2", "tokens: 9")


def test_split_adds_up_per_timer_and_keeps_only_shared_timers() -> None:
    whole = {"median_ms": 1.0, "profiler_ms": 0.8, "graph_ms": 0.9, "p10_ms": 0.95}
    got = split.split(whole, {"median_ms": 0.7, "profiler_ms": 0.5})
    assert set(got["logits_ms"]) == set(got["topk_ms"]) == {"median_ms", "profiler_ms"}
    for key in got["logits_ms"]:
        assert got["logits_ms"][key] + got["topk_ms"][key] == pytest.approx(whole[key])
    assert got["topk_ms"]["profiler_ms"] == pytest.approx(0.3) and "minus" in got["how"]
    row = {"timing": {**whole, "split": got}}
    assert split.stage_ms(row, "logits_ms", "median_ms") == 0.7
    assert split.stage_ms(row, "topk_ms", "graph_ms") is None  # the logits had no graph time
    assert split.stage_ms({"timing": whole}, "logits_ms", "median_ms") is None


def _prepared(which: str):
    case = _case(*(RAGGED if which.endswith("ragged") else PAGED["v4-2d-nextn3"]))
    x = inputs.make_inputs(case, "cpu")
    if which.startswith("torch"):
        return case, TorchReference().prepare(case, x, "cpu")
    if which.startswith("triton"):
        pytest.importorskip("triton", reason="needs triton (pip install triton)")
        from dsv4bench.backends.triton import indexer as triton_indexer

        return case, triton_indexer.prepare(case, x, "cpu")  # Triton's interpreter
    fake = FakeDeepGEMM28() if which.startswith("deepgemm-2.8.1") else FakeDeepGEMM("2.5.0")
    return case, DeepGEMM(fake).prepare(case, x, "cpu")


@pytest.mark.parametrize(
    "which",
    ["torch-paged", "torch-ragged", "triton-paged", "triton-ragged", "deepgemm-2.5.0-paged",
     "deepgemm-2.5.0-ragged", "deepgemm-2.8.1-paged", "deepgemm-2.8.1-ragged"],
)  # fmt: skip
def test_every_indexer_hands_over_its_logits_alone(which: str) -> None:
    case, p = _prepared(which)
    assert p.logits is not None
    alone = p.logits()
    raw = p.run()
    whole = raw.out if hasattr(raw, "out") else raw[0]  # the oracle returns an Output
    assert isinstance(alone, torch.Tensor) and torch.equal(alone, whole)  # no top-k in it
    if which != "deepgemm-2.8.1-ragged":  # 2.8.1's ragged rows are compressed, from ks
        assert alone.shape == (indexer_case.rows(case), indexer_case.keys(case))


def test_the_worker_times_the_logits_as_it_times_the_call(monkeypatch) -> None:
    case = _case(*RAGGED)
    timed = []

    def fake_measure(fn, **how):
        timed.append((fn(), how))
        return {"median_ms": 2.0 if len(timed) == 1 else 1.5}

    monkeypatch.setattr(timing, "measure", fake_measure)
    job = {"case": case.to_dict(), "backend": "torch", "arch": "cpu"}
    row = worker.run_job(job, worker.Cache())
    assert row["status"] == "ok", row["message"]
    (whole, how), (alone, how_alone) = timed
    assert how_alone == how  # the same timer, warm-up, iterations, L2 flush and graph
    assert isinstance(alone, torch.Tensor) and torch.equal(alone, whole.out)
    got = row["timing"]["split"]
    assert got["logits_ms"] == {"median_ms": 1.5} and got["topk_ms"] == {"median_ms": 0.5}


def test_a_cpu_row_splits_its_measured_time() -> None:
    case = _case(*RAGGED)
    job = {"case": case.to_dict(), "backend": "torch", "arch": "cpu"}
    row = worker.run_job(job, worker.Cache())
    t = row["timing"]
    logits, topk = t["split"]["logits_ms"]["median_ms"], t["split"]["topk_ms"]["median_ms"]
    assert logits > 0 and logits + topk == pytest.approx(t["median_ms"])
