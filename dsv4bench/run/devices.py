"""The devices a run's workers are pinned to: `--gpus all` or `--gpus 0,2` -> one Device each.

A Device is plain data (slot, index, name, uuid, what to put in CUDA_VISIBLE_DEVICES). Its
worker process sees only that GPU, so the kernels and allocations of its jobs stay on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from dsv4bench.env import uuid_text

VISIBLE = "CUDA_VISIBLE_DEVICES"


class DeviceError(ValueError):
    """A `--gpus` value this machine cannot honour (one line for the user)."""


@dataclass(frozen=True)
class Device:
    """One worker slot. `index` is the GPU's index as this process numbers them (None: the CPU);
    `visible` the CUDA_VISIBLE_DEVICES its worker gets (None: inherited, not pinned)."""

    slot: int
    index: int | None = None
    name: str = "cpu"
    uuid: str | None = None
    arch: str = "cpu"
    visible: str | None = None

    def worker_env(self) -> dict[str, str]:
        return {} if self.visible is None else {VISIBLE: self.visible}

    def row_env(self) -> dict:
        """What every row run on this device adds to its `env` block."""
        env: dict = {"slot": self.slot}
        if self.index is not None:
            env.update(gpu_index=self.index, gpu_uuid=self.uuid, gpu=self.name)
        return env

    @property
    def label(self) -> str:
        return "cpu" if self.index is None else f"gpu{self.index}"


def visible_gpus() -> list[Device]:
    """Every GPU this process sees, each pinned by the entry of CUDA_VISIBLE_DEVICES that names
    it (or its index when that is unset)."""
    import torch

    from dsv4bench.measure import hardware

    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    entries = [e.strip() for e in os.environ.get(VISIBLE, "").split(",") if e.strip()]
    found = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        found.append(
            Device(
                slot=i,
                index=i,
                name=props.name,
                uuid=uuid_text(getattr(props, "uuid", None)),
                arch=hardware.arch_of(i),
                visible=entries[i] if i < len(entries) else str(i),
            )
        )
    return found


def select(spec: str, present: list[Device]) -> list[Device]:
    """`--gpus` (`all` or comma-separated indices) -> the devices, one slot each, in that order.
    Raises DeviceError for a machine without GPUs, an unknown index, a repeat, or GPUs of
    different models (their timings and limits would mix in one run)."""
    if not present:
        raise DeviceError(f"--gpus {spec}: this machine has no CUDA GPU")
    if spec.strip() == "all":
        chosen = list(present)
    else:
        try:
            wanted = [int(x) for x in spec.split(",")]
        except ValueError:
            raise DeviceError(f"--gpus {spec}: expected 'all' or GPU indices such as 0,1") from None
        for i in wanted:
            if not 0 <= i < len(present):
                raise DeviceError(
                    f"--gpus {spec}: no GPU {i} (this machine has {len(present)}: "
                    f"0..{len(present) - 1})"
                )
        if len(set(wanted)) != len(wanted):
            raise DeviceError(f"--gpus {spec}: a GPU is named twice")
        chosen = [present[i] for i in wanted]
    models = sorted({d.name for d in chosen})
    if len(models) > 1:
        raise DeviceError(
            f"--gpus {spec}: GPUs of different models ({', '.join(models)}); "
            "run each model separately (timings and limits are per model)"
        )
    return [replace(d, slot=n) for n, d in enumerate(chosen)]


def default(arch: str) -> list[Device]:
    """One unpinned slot, as runs without `--gpus` have always had: GPU 0, or the CPU."""
    if arch == "cpu":
        return [Device(slot=0)]
    gpus = visible_gpus()
    if not gpus:
        return [Device(slot=0)]
    return [replace(gpus[0], visible=None)]


def cpu_slots(count: int) -> list[Device]:
    """`count` CPU slots: the pool's logic without a GPU (tests)."""
    return [Device(slot=i) for i in range(count)]
