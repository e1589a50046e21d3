"""The Triton attention's launch rules (backends/triton/tuning.py) as a table: every rule names
the measurement that chose it, every (kernel, KV source, head count, d_qk) finds exactly the
rule its group orders first, and no rule is unreachable. Read without Triton."""

from __future__ import annotations

import pytest

from dsv4bench.backends.triton import tuning

LAYOUTS = ("bf16", "v32", "v4")


def test_every_rule_names_the_ab_that_chose_it():
    for rule in tuning.RULES:
        assert "results/" in rule.chose or "sweep" in rule.chose, rule


@pytest.mark.parametrize("gluon", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_group_runs_from_few_heads_to_any(gluon, layout):
    group = [r for r in tuning.RULES if (r.gluon, r.layout) == (gluon, layout)]
    bounds = [r.max_heads for r in group if r.d_qk is None]
    assert bounds[-1] is None  # some rule takes any head count
    limits = [r.max_heads for r in group if r.max_heads is not None]
    assert limits == sorted(limits)


def test_every_rule_is_taken_somewhere():
    taken = {
        id(tuning.rule_for(h, lay, g, d))
        for g in (False, True)
        for lay in LAYOUTS
        for d in (512, 576)
        for h in range(1, 257)
    }
    assert taken == {id(r) for r in tuning.RULES}


def test_a_source_without_a_rule_is_refused():
    with pytest.raises(ValueError, match="no launch rule"):
        tuning.config_for(8, "fp4")
