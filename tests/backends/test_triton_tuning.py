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


# The Gluon kernel's measured choices (each rule's `chose` names the A/B): a changed chunk or
# idx_ahead is a new measurement, so it changes this table too.
GLUON_CHOICES = {
    # (KV source, heads, d_qk): (block_h, chunk, idx_ahead, prefetch, split_pv, key_bias,
    # lead_cols)
    ("v32", 8, 576): (16, 16, False, 0, False, False, 256),  # pipe 2: two 16-key chunks
    ("v32", 16, 576): (16, 16, False, 0, False, False, 256),
    ("v32", 32, 576): (32, 64, False, 1, False, False, 256),
    # idx_ahead was 6% slower on V3.2's cache; beside the L2 prefetch 0.5-8% faster
    ("v32", 128, 576): (64, 64, True, 1, True, True, 128),
    ("v4", 16, 512): (16, 32, True, 1, False, False, 256),
    # 32-key chunks: V4's footprint spills at 64; key_bias lost on V4 decode (producer-bound)
    ("v4", 64, 512): (64, 32, True, 1, True, False, 128),
    ("v4", 128, 512): (64, 32, True, 1, True, False, 128),
    ("bf16", 8, 576): (16, 64, True, 0, False, False, 256),  # resident, narrow
    ("bf16", 32, 512): (32, 64, True, 0, False, False, 256),
    # bf16 rows: the prefetch lost (consumer-bound), and the lead's PV on 128 columns
    ("bf16", 64, 576): (64, 64, True, 0, True, True, 256),
    ("bf16", 128, 512): (64, 16, True, 0, True, True, 256),
}


@pytest.mark.parametrize("where", sorted(GLUON_CHOICES))
def test_the_gluon_chunk_and_idx_ahead_are_the_measured_ones(where):
    layout, heads, d_qk = where
    cfg = tuning.config_for(heads, layout, gluon=True, d_qk=d_qk)
    got = (cfg.block_h, cfg.chunk, cfg.idx_ahead, cfg.prefetch, cfg.split_pv, cfg.key_bias)
    got += (cfg.lead_cols,)
    assert got == GLUON_CHOICES[where]


def test_the_triton_kernels_idx_ahead_is_the_measured_one():
    assert not tuning.config_for(128, "v32").idx_ahead  # 5% slower on V3.2's cache
    assert not tuning.config_for(16, "v4", d_qk=512).idx_ahead
    assert tuning.config_for(64, "v4", d_qk=512).idx_ahead  # 5-9% faster
    assert all(tuning.config_for(h, "bf16").idx_ahead for h in (8, 32, 128))
