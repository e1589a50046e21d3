"""head_padding ("engine" | "none" | "raw" | N) is read in one function, with each kernel's
HeadRule."""

from __future__ import annotations

import dataclasses

import pytest

from dsv4bench.backends import flashmla
from dsv4bench.backends.base import HeadRule, resolve_heads
from dsv4bench.backends.flashinfer import backend as flashinfer
from dsv4bench.backends.flashinfer import sm90 as flashinfer_fa3
from dsv4bench.cases.case import Case, padding_count

RULE = HeadRule("K", (64, 128), engine=64)
CASE = Case("t", "decode", "v4-flash", 512, 512, 16, layout="v4", topk=128)


@pytest.mark.parametrize(
    ("heads", "mode", "expected"),
    [
        (16, "engine", (64, None)),
        (16, "128", (128, None)),
        (16, "none", (0, "K takes 64/128 query heads; head_padding none gives 16")),
        (64, "none", (64, None)),
        (100, "64", (0, "100 heads exceed head_padding 64 (64)")),
        (
            200,
            "engine",
            (0, "200 heads exceed head_padding engine (64); K kernels take at most 128"),
        ),
        (16, "lots", (0, "unknown head_padding 'lots' (engine, none, raw or a head count)")),
        # raw: the kernel meets the heads as they are, whatever its rule
        (16, "raw", (16, None)),
        (200, "raw", (200, None)),
    ],
)
def test_resolve_heads(heads, mode, expected):
    case = dataclasses.replace(CASE, num_heads=heads, head_padding=mode)
    assert resolve_heads(case, RULE) == expected


def test_a_multiple_is_checked_unless_raw():
    rule = HeadRule("K", None, engine=64, multiple=64)
    for heads, mode, expected in [
        (96, "none", (0, "K takes query heads in multiples of 64, not 96 (head_padding none)")),
        (96, "128", (128, None)),
        (96, "raw", (96, None)),
    ]:
        assert (
            resolve_heads(dataclasses.replace(CASE, num_heads=heads, head_padding=mode), rule)
            == expected
        )


def test_every_backend_reads_head_padding_through_its_rule():
    case = dataclasses.replace(CASE, num_heads=12)
    assert flashmla.padded_heads(case, "sm90") == resolve_heads(
        case, flashmla.head_rule(case, "sm90")
    )
    assert flashinfer.padded_heads(case) == (16, None)
    assert flashinfer_fa3.padded_heads(case) == 12
    pinned = dataclasses.replace(case, head_padding="64")
    assert {flashmla.padded_heads(pinned, "sm90")[0], flashinfer.padded_heads(pinned)[0]} == {64}
    assert flashinfer_fa3.padded_heads(pinned) == 64 == padding_count("64")
    assert padding_count("engine") is None and padding_count("none") is None
    raw = dataclasses.replace(case, head_padding="raw")  # FlashMLA takes 64/128: it meets 12
    assert flashmla.padded_heads(raw, "sm90") == (12, None) == flashinfer.padded_heads(raw)
