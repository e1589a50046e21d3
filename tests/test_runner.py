"""The runner survives backends that crash, hang or raise, and writes every row at once."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dsv4bench import backends
from dsv4bench.case import Case, Timing
from dsv4bench.results import ResultWriter, read_rows
from dsv4bench.runner import Job, LimitSearch, Runner

PLUGIN = "tests.plugins.misbehaving"


def tiny(batch_size: int, **kw) -> Case:
    return Case(
        scenario="runner-test",
        op="decode",
        model="v3.2",
        d_qk=576,
        d_v=512,
        num_heads=4,
        batch_size=batch_size,
        topk=64,
        context_len=128,
        page_size=64,
        layout="v32",
        scale_convention="pow2",
        timing=Timing(warmup=0, iters=2, timeout_s=20),
        **kw,
    )


@pytest.fixture(scope="module", autouse=True)
def plugin():
    backends.setup([PLUGIN])


def test_crash_hang_and_error_become_rows_and_the_sweep_goes_on(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    seeds_batches = [(0, 1), (0, 4), (3, 1), (2, 1), (7, 1)]
    jobs = [Job(tiny(b, seed=s), "crashy") for s, b in seeds_batches]
    rows = runner.run(jobs)
    status = [r["status"] for r in rows]
    assert status == ["ok", "crash", "timeout", "error", "ok"]
    crash = rows[1]
    assert "exited with code 1" in crash["message"]
    assert "fatal error at batch 4" in crash["message"]
    assert "no answer after 20 s" in rows[2]["message"]
    assert "refuses seed 2" in rows[3]["message"]
    written = read_rows(tmp_path)
    assert [r["status"] for r in written] == status
    assert written[0]["accuracy"]["cos_diff"] < 1e-12
    assert written[0]["timing"]["n"] == 2
    assert written[0]["provider"]["name"] == "crashy"


def test_unsupported_is_recorded_with_its_reason(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    (row,) = runner.run([Job(replace(tiny(1), op="remap"), "crashy")])
    assert row["status"] == "unsupported"
    assert "no remap kernel" in row["message"]


def test_resume_skips_finished_jobs(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    jobs = [Job(tiny(1), "torch"), Job(tiny(2), "torch")]
    runner.run(jobs[:1])
    rows = runner.run(jobs, resume=True)
    assert len(rows) == 1 and rows[0]["params"]["batch_size"] == 2
    assert len(read_rows(tmp_path)) == 2


def test_limit_search_finds_the_last_working_batch(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    # crashy dies from batch 4 on, each probe in a fresh process
    search = LimitSearch("batch_size", 1, 9, "crashy", tiny(1))
    row = runner.find_limit(search)
    assert row["kind"] == "limit"
    assert (row["last_ok"], row["first_fail"]) == (3, 4)
    assert row["status"] == "crash"
    assert "fatal error at batch 4" in row["message"]
    probes = [r for r in read_rows(tmp_path) if r["kind"] == "case"]
    assert all("limit-probe" in r["tags"] for r in probes)
    assert json.loads(json.dumps(row))["probes"]["9"] == "crash"


def test_arch_scale_reading_is_compared_with_its_own_oracle_and_the_exact_one(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    raw = replace(tiny(1), scale_convention="raw")  # vLLM's non-power-of-two scales
    pow2 = tiny(1)
    rows = runner.run([Job(raw, "bf16-scales"), Job(pow2, "bf16-scales")])
    assert [r["status"] for r in rows] == ["ok", "ok"]
    raw_row, pow2_row = rows
    assert raw_row["accuracy"]["cos_diff"] == 0  # against the oracle reading scales as bf16
    assert raw_row["scale_reading"] == "bf16" and raw_row["tolerance"]["cos_diff"] == 5e-6
    assert raw_row["info"]["vs_exact_scales"]["cos_diff"] > 0  # bf16 scales do move it
    assert pow2_row["info"]["vs_exact_scales"]["cos_diff"] == 0  # powers of two survive
