"""The CPU's accuracy check is not hollow: the oracle's own rows are reference rows, and the
independent float64 backend agrees with the oracle on every smoke case but catches a changed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bench import backends, scenarios
from dsv4bench.backends import Output
from dsv4bench.backends.f64.backend import ReferenceF64
from dsv4bench.run import worker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke_cases():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the runner's CPU workers: no barrier stalls on a busy machine
    backends.setup([])
    sc = scenarios.load(ROOT / "scenarios" / "smoke.yaml", known_backends=backends.names())
    yield [c for c in sc.cases if c.op in ReferenceF64.ops]
    torch.set_num_threads(threads)


def _check(case, name):
    row, _ = worker.check(case, backends.get(name), "cpu", worker.Cache())
    return row


def test_every_smoke_case_agrees_with_the_oracle_but_not_bit_for_bit(smoke_cases):
    exact = 0
    for case in smoke_cases:
        row = _check(case, "reference-f64")
        assert row["status"] == "ok", (case.case_id, row["message"])
        assert row["accuracy"]["cos_diff"] <= case.tolerance.cos_diff
        exact += row["accuracy"]["cos_diff"] == 0
    attention = sum(c.op in ("decode", "prefill") for c in smoke_cases)
    assert exact <= len(smoke_cases) - attention  # float64 attention differs from fp32 a little


def test_the_oracles_own_rows_are_reference_rows(smoke_cases):
    row = _check(smoke_cases[0], "torch")
    assert row["status"] == "ok" and row.get("accuracy") is None
    assert "oracle itself" in row["info"]["reference_row"]


@pytest.mark.parametrize("op", ["decode", "prefill", "dequant", "remap"])
def test_a_changed_oracle_is_caught(smoke_cases, monkeypatch, op):
    from dsv4bench.cases import oracle

    case = next(c for c in smoke_cases if c.op == op)
    real = oracle.oracle_call

    def changed(case, inputs, reading=None):
        call = real(case, inputs, reading)

        def run():
            o = call()
            if o.out.dtype.is_floating_point:
                return Output(o.out * 1.01, o.lse)
            return Output(o.out.flip(-1), o.lse)  # indices: another order

        return run

    monkeypatch.setattr(oracle, "oracle_call", changed)  # the worker imports it from there
    row = _check(case, "reference-f64")
    assert row["status"] == "incorrect", row["accuracy"]
