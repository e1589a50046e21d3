"""A lossy backend's declared tolerance and its own exact oracle, through the worker: the row is
judged with the declared tolerance (and carries it, with why), and its accuracy holds the
distance to what the kernel claims (exact_*) beside the distance to the oracle."""

from __future__ import annotations

import torch

from dsv4bench.backends.base import Backend, Prepared
from dsv4bench.cases.case import Tolerance
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.cases.output import Output
from dsv4bench.run.worker import Cache, check_row
from tests.factories import V32, make_case

LOOSE = Tolerance(cos_diff=1e-2, lse_abs=0.5)


class Lossy(Backend):
    """The oracle's answer with 1 % noise; it claims exactly that noisy answer (or, with
    `drift`, that answer with `drift` times as much noise again: a kernel off its own model)."""

    name = "lossy"
    archs = ("cpu",)
    ops = ("prefill",)

    def __init__(self, declares: bool = True, tolerance: Tolerance = LOOSE, drift: float = 0.0):
        self.declares, self.tolerance, self.drift = declares, tolerance, drift

    def declared_tolerance(self, case):
        return (self.tolerance, "declared by lossy: noise") if self.declares else None

    def prepare(self, case, inputs, device):
        want = oracle_call(case, inputs)()
        g = torch.Generator().manual_seed(0)
        scale = 0.01 * want.out.abs().mean()
        noisy = want.out + scale * torch.randn(want.out.shape, generator=g)
        claimed = noisy + self.drift * scale * torch.randn(want.out.shape, generator=g)
        answer = Output(noisy, want.lse + 0.01)
        return Prepared(run=lambda: answer, exact=lambda: Output(claimed, answer.lse))


CASE = make_case(V32, op="prefill", num_heads=8, tokens=4, topk=128, context_len=256)


def test_judged_with_the_declared_tolerance_and_its_own_exactness():
    row, _ = check_row(CASE, Lossy(), "cpu", Cache())
    assert row.status == "ok"
    assert row.tolerance == {"cos_diff": 1e-2, "lse_abs": 0.5}
    assert row.info["tolerance_from"] == "declared by lossy: noise"
    assert row.accuracy["cos_diff"] > CASE.tolerance.cos_diff  # beyond the case's own
    assert row.accuracy["exact_cos_diff"] == 0.0 and row.accuracy["exact_lse_max_abs"] == 0.0


def test_without_a_declaration_the_case_tolerance_judges():
    row, _ = check_row(CASE, Lossy(declares=False), "cpu", Cache())
    assert row.status == "incorrect"
    assert row.tolerance["cos_diff"] == CASE.tolerance.cos_diff
    assert "tolerance_from" not in row.info


EXACT = Tolerance(cos_diff=1e-2, lse_abs=0.5, exact_cos_diff=1e-5, exact_lse_abs=1e-3)


def test_a_declared_exact_bound_fails_a_kernel_off_its_own_model():
    row, _ = check_row(CASE, Lossy(tolerance=EXACT), "cpu", Cache())
    assert row.status == "ok"
    assert row.tolerance == {"cos_diff": 1e-2, "lse_abs": 0.5, "exact_cos_diff": 1e-5,
                             "exact_lse_abs": 1e-3}  # fmt: skip
    row, _ = check_row(CASE, Lossy(tolerance=EXACT, drift=1.0), "cpu", Cache())
    assert row.accuracy["cos_diff"] < EXACT.cos_diff  # within the tolerance against the oracle
    assert row.status == "incorrect" and row.message.startswith("exact_cos_diff ")
    row, _ = check_row(CASE, Lossy(drift=1.0), "cpu", Cache())
    assert row.status == "ok"  # the same answer with no exact bound declared: recorded only


def test_a_row_says_when_the_oracles_max_logits_went_unjudged():
    row, _ = check_row(CASE, Lossy(), "cpu", Cache())
    assert "max_logits_max_abs" not in row.accuracy  # the answer has none to compare
    assert row.info["max_logits"].startswith("not judged")
