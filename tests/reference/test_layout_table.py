"""The layout table agrees with its writers and readers, and the suite asks it."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.cases import case as case_module
from dsv4bench.cases.case import Case
from dsv4bench.measure import metrics
from reference import layout_table
from reference.layout_table import FP8_LAYOUTS, LAYOUTS


@pytest.mark.parametrize("name", FP8_LAYOUTS)
@pytest.mark.parametrize("page_size", [1, 64])
def test_each_fp8_entry_matches_what_its_writer_writes_and_its_reader_reads(name, page_size):
    lay = LAYOUTS[name]
    kv = torch.randn(page_size * 2, lay.d_qk).to(torch.bfloat16).float()
    for convention in lay.conventions:
        cache = lay.writer()(kv, page_size, convention)
        assert cache.shape == (2, page_size, 1, lay.token_bytes)
        back = lay.reader()(cache, scale_rounding=None)
        assert back.shape == (page_size * 2, lay.d_qk)
        # the bf16 rope part is stored as is
        assert torch.equal(back[:, lay.d_nope :], kv[:, lay.d_nope :])
    same_width = [n for n, other in LAYOUTS.items() if other.token_bytes == lay.token_bytes]
    # a width several layouts share (528: v41 and v32-nope) names none of them
    assert layout_table.of_width(lay.token_bytes) is (lay if same_width == [name] else None)
    same_d_qk = [n for n, other in LAYOUTS.items() if other.fp8 and other.d_qk == lay.d_qk]
    assert layout_table.of_d_qk(lay.d_qk) == same_d_qk[0]  # the first shipped (v4 for 512)
    assert lay.d_nope % lay.tile == 0


def test_the_suite_takes_layouts_and_conventions_from_the_table():
    assert tuple(LAYOUTS) == case_module.LAYOUTS
    for name, lay in LAYOUTS.items():
        c = Case("t", "decode", "m", lay.d_qk or 128, 128, 1, layout=name)
        assert c.scale_convention == lay.default_convention
        assert metrics.kv_token_bytes(c) == lay.bytes_per_token(c.d_qk)
    assert layout_table.of_d_qk(123) == "bf16"
    with pytest.raises(ValueError, match="unknown layout 'v5'"):
        layout_table.layout("v5")
