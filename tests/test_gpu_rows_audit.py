"""The committed H100 rows of issue 22's GPU items say what the fixes claim
(results/sm90/studies/measurement/audit/NOTES.md)."""

from __future__ import annotations

from pathlib import Path

from dsv4bench.report.load import load_rows

RUNS = Path(__file__).resolve().parent.parent / "results/sm90/studies/measurement/audit"


def test_flashmla_runs_v4_flash_c128_at_a_500k_context_padded_as_engines_pad():
    rows = load_rows(RUNS / "c128")
    long = [r for r in rows if r["params"]["context_len"] == 500_000 and r["backend"] == "flashmla"]
    assert len(long) == 2 and all(r["status"] == "ok" for r in long)
    for r in long:
        assert r["params"]["extra_topk"] == 3906
        padded = r["info"]["extra_topk_padded"]
        assert (padded["from"], padded["to"], padded["extra_topk_length"]) == (3906, 3968, 3906)
        assert r["accuracy"]["cos_diff"] < r["tolerance"]["cos_diff"]
    assert r["env"]["gpu"].startswith("NVIDIA H100")


def test_flashinfer_e4m3_on_raw_v32_scales_is_judged_on_what_it_reads():
    rows = load_rows(RUNS / "v32-scales")
    fi = {
        (r["params"]["scale_convention"], r["params"]["batch_size"]): r
        for r in rows
        if r["backend"] == "flashinfer-e4m3"
    }
    assert len(fi) == 4 and all(r["status"] == "ok" for r in fi.values())
    for b in (1, 32):
        raw, pow2 = fi[("raw", b)], fi[("pow2", b)]
        assert raw["scale_reading"] == "bf16-product"
        assert "fp32 scale not rounded" in raw["info"]["reads_what"]["latent"]
        # the kernel's own error is the same on both scale kinds; the 2e-5 is the conversion
        assert raw["accuracy"]["cos_diff"] < 1.1 * pow2["accuracy"]["cos_diff"]
        assert raw["info"]["vs_exact_scales"]["cos_diff"] > 5 * raw["accuracy"]["cos_diff"]
        assert raw["info"]["conversion"]["cos_diff"] > 5e-6
