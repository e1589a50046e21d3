"""Per-GPU specs (datasheet peaks, what the device reports) and the limits they predict."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

# sglang's DSv4 backend routes `q.shape[0] > 11673` away from the decode kernel. 11673 is
# floor((228 KiB / 4 - 1) / 5) with 228 KiB = 233472 B, the per-SM shared memory of sm90/sm100,
# not the per-block opt-in (227 KiB = 232448 B) that bounds one kernel (docs/kernel-facts.md,
# FlashMLA decode scheduler limit).
SGLANG_DSV4_THRESHOLD = 11673

SMEM_OPTIN_SM90 = 232448  # 227 KiB: sm90 and sm100 (CUDA Hopper/Blackwell tuning guides)
SMEM_OPTIN_SM120 = 101376  # 99 KiB: compute capability 12.0 (CUDA Blackwell tuning guide)

TERA = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """What the suite knows about one GPU. Peaks are dense (no 2:4 sparsity), per GPU.

    `from_device` names the fields read from the running device; they override the table.
    """

    name: str  # table key ("h100") or the device's own name for GPUs not in the table
    arch: str  # "sm90" | "sm100" | "sm120" | "cpu" | "smXY" for others
    sm_count: int | None = None
    smem_per_block_optin: int | None = None  # bytes
    l2_bytes: int | None = None
    peak_bf16: float | None = None  # FLOP/s, dense tensor core, fp32 accumulate
    peak_fp8: float | None = None  # FLOP/s, dense
    peak_bw: float | None = None  # bytes/s, device memory
    source: str = ""  # where the table numbers come from
    device_name: str = ""  # what torch reported, when detected
    from_device: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["from_device"] = list(self.from_device)
        return d


def _tf(x: float) -> float:
    return x * TERA


# Numbers are the vendor datasheet's unless `source` says otherwise; L2 is what torch reports
# where it was seen (the device's own value replaces it anyway).
TABLE: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        name="h100",
        arch="sm90",
        sm_count=132,
        smem_per_block_optin=SMEM_OPTIN_SM90,
        l2_bytes=50 * 2**20,
        peak_bf16=_tf(989.4),
        peak_fp8=_tf(1978.9),
        peak_bw=3.35e12,
        source="H100 SXM5 80GB datasheet; L2 as torch 2.11 reports on an H100 80GB HBM3",
    ),
    "h200": GpuSpec(
        name="h200",
        arch="sm90",
        sm_count=132,
        smem_per_block_optin=SMEM_OPTIN_SM90,
        l2_bytes=60 * 2**20,
        peak_bf16=_tf(989.4),
        peak_fp8=_tf(1978.9),
        peak_bw=4.8e12,
        source="H200 SXM datasheet (H100 compute, 141 GB HBM3e 4.8 TB/s); L2 as torch reports",
    ),
    "h800": GpuSpec(
        name="h800",
        arch="sm90",
        sm_count=132,
        smem_per_block_optin=SMEM_OPTIN_SM90,
        l2_bytes=50 * 2**20,
        peak_bf16=_tf(989.4),
        peak_fp8=_tf(1978.9),
        peak_bw=3.35e12,
        source="H800 SXM5: H100 SXM5 tensor throughput and HBM3 3.35 TB/s (export variant)",
    ),
    "h20": GpuSpec(
        name="h20",
        arch="sm90",
        sm_count=78,
        smem_per_block_optin=SMEM_OPTIN_SM90,
        l2_bytes=60 * 2**20,
        peak_bf16=_tf(148),
        peak_fp8=_tf(296),
        peak_bw=4.0e12,
        source="H20 datasheet: 148 TFLOP/s bf16, 296 fp8, 96 GB HBM3 4.0 TB/s, 60 MB L2; "
        "78 SMs as reported by device queries (Geekbench listing)",
    ),
    "b200": GpuSpec(
        name="b200",
        arch="sm100",
        sm_count=148,
        smem_per_block_optin=SMEM_OPTIN_SM90,
        l2_bytes=None,
        peak_bf16=_tf(2250),
        peak_fp8=_tf(4500),
        peak_bw=8.0e12,
        source="HGX B200 datasheet per GPU (1000 W): 4.5 PFLOP/s bf16 and 9 fp8 with sparsity, "
        "halved for dense; HBM3e 8 TB/s",
    ),
    "gb200": GpuSpec(
        name="gb200",
        arch="sm100",
        sm_count=148,
        smem_per_block_optin=SMEM_OPTIN_SM90,
        l2_bytes=None,
        peak_bf16=_tf(2500),
        peak_fp8=_tf(5000),
        peak_bw=8.0e12,
        source="GB200 NVL72 datasheet per GPU (1200 W): 5 PFLOP/s bf16 and 10 fp8 with "
        "sparsity, halved for dense; HBM3e 8 TB/s; SM count assumed equal to B200's",
    ),
    "rtx-pro-6000": GpuSpec(
        name="rtx-pro-6000",
        arch="sm120",
        sm_count=188,
        smem_per_block_optin=SMEM_OPTIN_SM120,
        l2_bytes=128 * 2**20,
        peak_bf16=_tf(503.8),
        peak_fp8=_tf(1007.6),
        peak_bw=1.792e12,
        source="RTX PRO 6000 Blackwell Workstation Edition: 188 SMs, 128 MB L2, GDDR7 512-bit "
        "1792 GB/s; tensor peaks derived from the datasheet's 4 PFLOP/s fp4 with sparsity "
        "(fp32 accumulate at full rate on the pro parts)",
    ),
}

CPU = GpuSpec(name="cpu", arch="cpu", source="no peaks for a CPU")

# Checked in order: the first match wins, so "gb200" precedes "b200" and "h200" precedes "h20".
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bgb200\b", "gb200"),
    (r"\bb200\b", "b200"),
    (r"\bh200\b", "h200"),
    (r"\bh20\b", "h20"),
    (r"\bh800\b(?!.*pcie)", "h800"),
    # H100 PCIe and NVL are different parts (fewer SMs, less bandwidth): not this entry.
    (r"\bh100\b(?=.*(sxm|hbm3))(?!.*(pcie|nvl))", "h100"),
    (r"rtx pro 6000 blackwell(?!.*max-q)", "rtx-pro-6000"),
)


def lookup(device_name: str) -> GpuSpec | None:
    """The table entry for a torch device name such as "NVIDIA H100 80GB HBM3", or None."""
    name = device_name.lower()
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, name):
            return TABLE[key]
    return None


def arch_of_capability(major: int, minor: int) -> str:
    """Architecture family of a compute capability: 9.x sm90, 10.x sm100, 12.x sm120."""
    return {9: "sm90", 10: "sm100", 12: "sm120"}.get(major, f"sm{major}{minor}")


def _cuda_index(device) -> int | None:
    """The CUDA device index `device` names, or None for a CPU."""
    import torch

    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return dev.index if dev.index is not None else torch.cuda.current_device()


def arch_of(device) -> str:
    """Architecture family of a device, index or device string: sm90, sm100, sm120 or cpu."""
    import torch

    index = _cuda_index(device)
    if index is None or not torch.cuda.is_available():
        return "cpu"
    return arch_of_capability(*torch.cuda.get_device_capability(index))


def memory_bytes(arch: str) -> tuple[int, str] | None:
    """The most a job on `arch` can hold, and what that is: the host's RAM for the CPU (the
    oracle's runs), GPU 0's memory for a GPU; None when this machine cannot tell."""
    import os

    if arch == "cpu":
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this machine's RAM"
        except (ValueError, OSError, AttributeError):  # no sysconf names (not Linux, macOS)
            return None
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.total_memory, f"the memory of this machine's {props.name}"


def spec_from_properties(props) -> GpuSpec:
    """Merge the table entry for `props.name` with what the device reports (device wins)."""
    arch = arch_of_capability(props.major, props.minor)
    base = lookup(props.name) or GpuSpec(
        name=props.name, arch=arch, source="not in the table: no peaks"
    )
    measured = {
        "arch": arch,
        "sm_count": getattr(props, "multi_processor_count", None),
        "smem_per_block_optin": getattr(props, "shared_memory_per_block_optin", None),
        "l2_bytes": getattr(props, "L2_cache_size", None),
    }
    measured = {k: v for k, v in measured.items() if v}
    return replace(base, device_name=props.name, from_device=tuple(measured), **measured)


def detect(device=None) -> GpuSpec:
    """The spec of `device` (default: the current CUDA device, else the CPU)."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    index = _cuda_index(device)
    if index is None or not torch.cuda.is_available():
        return CPU
    return spec_from_properties(torch.cuda.get_device_properties(index))


def flashmla_sched_batch_limit(smem_optin: int) -> int:
    """Largest batch FlashMLA's decode scheduler can take: it needs 4*(5b+1) bytes of dynamic
    shared memory for batch b, within the per-block opt-in limit (docs/kernel-facts.md, FlashMLA
    decode scheduler limit)."""
    return (smem_optin // 4 - 1) // 5


def sglang_crash_batches(smem_optin: int) -> range:
    """Batch sizes sglang's DSv4 policy sends to the decode kernel that its scheduler cannot
    take: empty when the real limit is at or above the threshold."""
    return range(flashmla_sched_batch_limit(smem_optin) + 1, SGLANG_DSV4_THRESHOLD + 1)
