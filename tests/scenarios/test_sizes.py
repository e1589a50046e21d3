"""Sizes past what any GPU holds are a plan-time error naming the bytes, not an `oom` row."""

from __future__ import annotations

import pytest

from dsv4bench import scenarios
from dsv4bench.backends import catalog

HEAD = """name: big
op: decode
backends: [torch]
defaults: {model: v3.2, batch_size: 1, topk: 64, context_len: 256, num_heads: 8}
"""


@pytest.mark.parametrize(
    "case, where, needs",
    [
        ("num_heads: 2147483648", "6: cases[0].num_heads", "needs 4,352.0 GiB (q 2,304.0 GiB"),
        ("context_len: 1000000000000", "6: cases[0].context_len", "(cache 610,947.6 GiB)"),
        (
            "{op: prefill, tokens: 20000000, context_len: 20000000, num_heads: 128}",
            "6: cases[0].num_heads",
            "q 2,746.6 GiB",
        ),
    ],
)
def test_a_case_no_gpu_can_hold_is_a_scenario_error(case, where, needs):
    text = HEAD + f"cases:\n  - {case}\n"
    with pytest.raises(scenarios.ScenarioError) as e:
        scenarios.load_text(text, "big.yaml", known_backends=catalog())
    assert str(e.value).startswith(f"big.yaml:{where}: this case needs ")
    assert needs in str(e.value) and "more than any GPU holds" in str(e.value)


def test_a_limit_search_may_end_past_any_gpu_but_not_start_there():
    limit = "limit:\n  - {axis: context_len, lo: 256, hi: 1000000000000, backend: torch}\n"
    sc = scenarios.load_text(HEAD + limit, "big.yaml", known_backends=catalog())
    assert len(sc.limits) == 1
    start = limit.replace("lo: 256", "lo: 900000000000")
    with pytest.raises(scenarios.ScenarioError, match="more than any GPU holds"):
        scenarios.load_text(HEAD + start, "big.yaml", known_backends=catalog())


def test_plan_refuses_in_one_line(tmp_path, run_cli):
    path = tmp_path / "big.yaml"
    path.write_text(HEAD + "cases:\n  - num_heads: 2147483648\n")
    code, out, err = run_cli("plan", path)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "more than any GPU holds" in err
