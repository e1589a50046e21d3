"""Sizes past what any GPU holds are a plan-time error naming the bytes, not an `oom` row."""

from __future__ import annotations

from pathlib import Path

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


def test_a_case_past_this_machines_memory_is_refused_by_run_and_flagged_by_plan(
    tmp_path, monkeypatch, run_cli
):
    from dsv4bench.measure import hardware

    # 64 requests of 2**20 tokens: a 41 GiB cache, past a 16 GiB machine (any GPU holds it)
    real = hardware.memory_bytes
    monkeypatch.setattr(hardware, "memory_bytes", lambda arch: (16 * 2**30, f"{arch} memory"))
    big = tmp_path / "big.yaml"
    big.write_text(HEAD + "cases:\n  - {context_len: 1048576, batch_size: 64}\n  - {}\n")
    out = tmp_path / "r"
    code, stdout, err = run_cli("run", big, "--arch", "cpu", "--out", out, "--quiet")
    assert code == 2 and not stdout and len(err.strip().splitlines()) == 1, err
    assert err.startswith("dsv4bench: decode-v3.2-v32-h8-b64-")
    assert err.strip().endswith(
        "on torch: needs 41.0 GiB (cache 41.0 GiB), more than cpu memory (16.0 GiB); "
        "leave it out or run it where it fits"
    )
    assert not out.exists()
    code, stdout, _ = run_cli("plan", big, "--arch", "cpu")
    assert code == 0 and "on cpu: 1 too big for this machine (run refuses them), e.g." in stdout
    # what the machine has: the CPU oracle's budget is the RAM /proc/meminfo reports
    monkeypatch.setattr(hardware, "memory_bytes", real)
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total_kib = int(meminfo.read_text().split("MemTotal:")[1].split()[0])
        budget, what = hardware.memory_bytes("cpu")
        assert what == "this machine's RAM" and abs(budget - total_kib * 1024) < 2**30
