from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dsv4bench.cases.case import ARCHS
from dsv4bench.measure import hardware

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_sched_limit_on_sm90_and_sm100():
    limit = hardware.flashmla_sched_batch_limit(232448)
    assert limit == 11622
    assert 4 * (5 * limit + 1) <= 232448 < 4 * (5 * (limit + 1) + 1)


def test_sglang_threshold_is_the_per_sm_figure():
    # 228 KiB per SM instead of 227 KiB per block gives exactly sglang's threshold
    assert hardware.flashmla_sched_batch_limit(228 * 1024) == hardware.SGLANG_DSV4_THRESHOLD


def test_predicted_crash_window():
    window = hardware.sglang_crash_batches(232448)
    assert (window.start, window.stop - 1, len(window)) == (11623, 11673, 51)
    assert len(hardware.sglang_crash_batches(10**6)) == 0


def test_sm120_limit():
    assert hardware.flashmla_sched_batch_limit(hardware.SMEM_OPTIN_SM120) == 5068


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 SXM5 80GB", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA H800", "h800"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA A100-SXM4-80GB", None),
        ("NVIDIA GeForce RTX 5090", None),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", None),
    ],
)
def test_lookup_by_device_name(name, key):
    spec = hardware.lookup(name)
    assert (spec.name if spec else None) == key


def test_table_is_consistent():
    for key, spec in hardware.TABLE.items():
        assert spec.name == key
        assert spec.arch in ARCHS and spec.arch != "cpu"
        assert spec.peak_fp8 == pytest.approx(2 * spec.peak_bf16, rel=1e-3)  # datasheet rounding
        assert spec.peak_bw > 1e12 and spec.sm_count > 0 and spec.source
        expected_smem = 101376 if spec.arch == "sm120" else 232448
        assert spec.smem_per_block_optin == expected_smem
    h100 = hardware.TABLE["h100"]
    assert (h100.peak_bf16, h100.peak_bw) == (pytest.approx(989e12, rel=1e-3), 3.35e12)


@pytest.mark.parametrize(
    "cc, arch",
    [((9, 0), "sm90"), ((10, 0), "sm100"), ((10, 3), "sm100"), ((12, 0), "sm120"),
     ((12, 1), "sm120"), ((8, 0), "sm80")],
)  # fmt: skip
def test_arch_of_capability(cc, arch):
    assert hardware.arch_of_capability(*cc) == arch


def test_cpu_device():
    assert hardware.arch_of("cpu") == "cpu"
    assert hardware.arch_of(torch.device("cpu")) == "cpu"
    spec = hardware.detect("cpu")
    assert spec.arch == "cpu" and spec.peak_bf16 is None and spec.peak_bw is None


def _props(name, major, minor, sms=132, smem=232448, l2=50 * 2**20):
    return SimpleNamespace(
        name=name,
        major=major,
        minor=minor,
        multi_processor_count=sms,
        shared_memory_per_block_optin=smem,
        L2_cache_size=l2,
    )


def test_device_values_override_the_table():
    spec = hardware.spec_from_properties(_props("NVIDIA H100 80GB HBM3", 9, 0, sms=114, l2=123))
    assert spec.name == "h100" and spec.device_name == "NVIDIA H100 80GB HBM3"
    assert (spec.sm_count, spec.l2_bytes) == (114, 123)
    assert spec.peak_bf16 == hardware.TABLE["h100"].peak_bf16
    assert set(spec.from_device) == {"arch", "sm_count", "smem_per_block_optin", "l2_bytes"}


def test_unknown_gpu_has_no_peaks():
    spec = hardware.spec_from_properties(_props("NVIDIA A100-SXM4-80GB", 8, 0, 108, 166912))
    assert (spec.name, spec.arch, spec.sm_count) == ("NVIDIA A100-SXM4-80GB", "sm80", 108)
    assert spec.peak_bf16 is None and spec.peak_bw is None


def test_missing_property_keeps_the_table_value():
    props = _props("NVIDIA H200", 9, 0)
    del props.shared_memory_per_block_optin
    spec = hardware.spec_from_properties(props)
    assert spec.smem_per_block_optin == 232448
    assert "smem_per_block_optin" not in spec.from_device
    assert spec.to_dict()["from_device"] == list(spec.from_device)


@pytest.mark.gpu
@needs_gpu
def test_detect_real_gpu():
    spec = hardware.detect("cuda")
    props = torch.cuda.get_device_properties(0)
    assert spec.arch == hardware.arch_of(0) == hardware.arch_of("cuda:0")
    assert spec.sm_count == props.multi_processor_count
    assert spec.smem_per_block_optin == props.shared_memory_per_block_optin
