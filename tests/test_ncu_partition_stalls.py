"""tools/ncu_partition_stalls.py on a hand-made source page: parts cut at USETMAXREG, shares and
stall reasons per part, the mbarrier retry branch named, bad input refused."""

from __future__ import annotations

import subprocess
import sys

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_wait",'
          '"stall_long_sb (Not Issued)"')  # fmt: skip


def _page(*rows: tuple[str, int, int]) -> str:
    body = [f'"0x{i:x}","{src}","{lsb + w}","{lsb}","{w}","0"' for i, (src, lsb, w) in
            enumerate(rows)]  # fmt: skip
    return "\n".join(['"Kernel Name","attn_kernel",', HEADER, *body]) + "\n"


def _run(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/ncu_partition_stalls.py", "--top", "2"],
                          input=text, capture_output=True, text=True)  # fmt: skip


def test_samples_are_split_at_the_register_hand_overs():
    page = _page(("LDC R1, c[0x0][0x28]", 0, 10),
                 ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", 0, 0),
                 ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1]", 0, 5),
                 ("@!P0 BRA 0x100", 60, 0),
                 ("USETMAXREG.DEALLOC.CTAPOOL 0x28", 0, 25))  # fmt: skip
    r = _run(page)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "attn_kernel: 100 samples, 5 instructions"
    consumer = next(line for line in lines if "0xe8" in line)
    assert "65.0% of samples" in consumer and "long_sb 92%, wait 8%" in consumer
    assert any("@!P0 BRA 0x100  (mbarrier wait)" in line for line in lines)
    assert any("25.0% of samples; wait 100%" in line for line in lines)


def test_input_without_samples_exits_2():
    r = _run("not a source page\n")
    assert r.returncode == 2 and "no per-instruction samples" in r.stderr
