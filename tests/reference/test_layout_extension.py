"""Adding a cache layout: a table entry plus a writer and a reader (here, in this file) is all
the oracle needs; a backend that does not list the layout answers `unsupported` with the
reason, and `plan` says so on every arch instead of crashing or calling it supported."""

from __future__ import annotations

import pytest
import torch

from dsv4bench import backends
from dsv4bench import cli as dsv4cli
from dsv4bench.cases.case import ARCHS
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call
from reference import layout_table
from reference.layout_table import CacheLayout
from tests.factories import make_case

D = 512
TOKEN_BYTES = 2 * D  # bf16 rows: a width no shipped layout has


def write_scratch(kv: torch.Tensor, page_size: int, convention: str = "") -> torch.Tensor:
    pages = -(-kv.shape[0] // page_size)
    rows = torch.zeros(pages * page_size, D, dtype=torch.bfloat16, device=kv.device)
    rows[: kv.shape[0]] = kv.to(torch.bfloat16)
    return rows.view(torch.uint8).view(pages, page_size, 1, TOKEN_BYTES)


def read_scratch(cache: torch.Tensor, *, scale_rounding: str | None = None) -> torch.Tensor:
    return cache.contiguous().view(torch.uint8).view(-1, TOKEN_BYTES).view(torch.bfloat16).float()


def _entry(name: str, **kw) -> CacheLayout:
    return CacheLayout(
        name,
        "a scratch layout: bf16 rows in pages",
        token_bytes=TOKEN_BYTES,
        d_qk=D,
        d_v=D,
        d_nope=None,
        tile=None,
        scale_format="",
        conventions=(),
        module=__name__,
        **kw,
    )


@pytest.fixture
def scratch(monkeypatch):
    entry = _entry("scratch", write="write_scratch", read="read_scratch")
    monkeypatch.setitem(layout_table.LAYOUTS, "scratch", entry)
    monkeypatch.setitem(layout_table.LAYOUTS, "half", _entry("half"))  # no writer/reader yet
    return entry


SCRATCH_CASE = dict(
    d_qk=D, d_v=D, num_heads=8, topk=64, context_len=256, page_size=64, layout="scratch"
)


def test_the_oracle_reads_a_new_layout_through_the_table(scratch):
    case = make_case(SCRATCH_CASE)
    x = make_inputs(case, "cpu")
    assert x["k_cache"].shape[-1] == TOKEN_BYTES
    out = oracle_call(case, x)()
    assert out.out.shape == (1, 1, 8, D) and bool(torch.isfinite(out.out).all())
    assert backends.get("torch").supports(case, "cpu") is None


@pytest.mark.parametrize("op", ["decode", "prefill", "dequant"])
def test_backends_that_do_not_opt_in_say_unsupported_with_the_reason(scratch, op):
    case = make_case(SCRATCH_CASE, op=op)
    for name in backends.names():
        b = backends.get(name)
        if b.layouts is None:
            continue  # the oracle: reads any complete layout
        for arch in ARCHS:
            reason = b.supports(case, arch)
            assert reason, (name, arch)
            if arch in b.archs and op in b.ops:
                assert "not layout scratch" in reason, (name, arch, reason)


def test_plan_never_calls_an_unreadable_layout_supported(scratch, tmp_path, capsys):
    path = tmp_path / "scratch.yaml"
    path.write_text(
        "name: scratch\nop: decode\nmodel: v4-flash\nbackends: all\n"
        "sweep: {layout: [scratch, half]}\ndefaults: {batch_size: 2, context_len: 4096}\n"
    )
    for arch in ("sm90", "sm100", "sm120", "cpu"):
        assert dsv4cli.main(["plan", str(path), "--arch", arch]) == 0
        jobs = [line.split() for line in capsys.readouterr().out.splitlines() if "-h64-" in line]
        assert len(jobs) == 2 * len(backends.names())
        for case_id, backend, _arch, verdict, *_ in jobs:
            ok = backend == "torch" and "-scratch-" in case_id
            assert verdict.rstrip(":") == ("supported" if ok else "unsupported"), (arch, backend)
