"""The build x next_n matrix (scenarios/compare/deepgemm_builds_sm90.yaml): with
`next_n_rule: false` the adapter hands the sm90 paged kernel any next_n, so that each build's own
check answers, where by default it refuses what 2.5.0 and 2.8.1 refuse (SM90_NEXT_N)."""

from __future__ import annotations

from dsv4bench.backends import deepgemm as dgb
from dsv4bench.backends.deepgemm import DeepGEMM
from dsv4bench.cases import inputs
from tests.backends.test_deepgemm_backend import FakeDeepGEMM28, _case


def test_without_the_rule_next_n_3_reaches_the_kernel(monkeypatch) -> None:
    case = _case("v3.2", "batch_size: 2\n        s_q: 3")
    assert "not 3" in DeepGEMM(FakeDeepGEMM28()).supports(case, "sm90")  # the rule refuses
    fake = FakeDeepGEMM28()
    b = DeepGEMM(fake, next_n_rule=False)
    assert b.supports(case, "sm90") is None
    monkeypatch.setattr(dgb, "_device_arch", lambda device: "sm90")
    p = b.prepare(case, inputs.make_inputs(case, "cpu"), "cpu")
    p.run()
    assert p.info["schedule_slots"] == 132  # a task per SM: only next_n 4 pairs CTAs
    assert fake.calls and fake.calls[-1][0] == "paged"


def test_the_option_is_declared() -> None:
    assert DeepGEMM.options["next_n_rule"] is True
