"""--gpus: one worker per device fed from one queue, tested with CPU slots in place of GPUs."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4bench import backends
from dsv4bench.cases.case import Case, Timing
from dsv4bench.rows.results import ResultWriter, read_rows
from dsv4bench.run import devices
from dsv4bench.run.devices import Device, DeviceError
from dsv4bench.run.runner import Job, LimitSearch, Runner, Worker
from tests.factories import V32, make_case

PLUGIN = "tests.plugins.misbehaving"


TINY = dict(
    V32,
    scenario="pool-test",
    num_heads=4,
    topk=64,
    context_len=128,
    timing=Timing(warmup=0, iters=2, timeout_s=30),
)


def tiny(batch_size: int, seed: int = 0) -> Case:
    return make_case(TINY, batch_size=batch_size, seed=seed)


@pytest.fixture(scope="module", autouse=True)
def plugin():
    backends.setup([PLUGIN])


def _environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


class Recorder:
    """A worker factory that notes which slot each worker was started for and what
    CUDA_VISIBLE_DEVICES it got."""

    def __init__(self):
        self.started: list[tuple[int, str | None]] = []
        self.workers: list[Worker] = []

    def __call__(self, device: Device) -> Worker:
        w = Worker("cpu", [PLUGIN], env=device.worker_env())
        pinned = _environ(w.proc.pid).get(devices.VISIBLE) if Path("/proc").exists() else None
        self.started.append((device.slot, pinned))
        self.workers.append(w)
        return w


def pinned_slots(count: int) -> list[Device]:
    return [replace(d, visible=f"{10 + d.slot}") for d in devices.cpu_slots(count)]


def test_two_slots_share_the_jobs_keep_a_search_on_one_slot_and_survive_a_crash(tmp_path):
    made = Recorder()
    runner = Runner(
        ResultWriter(tmp_path),
        arch="cpu",
        plugins=[PLUGIN],
        progress=False,
        devices=pinned_slots(2),
        worker_factory=made,
    )
    jobs = [Job(tiny(1, seed=s), "torch") for s in range(3)]
    jobs += [Job(tiny(4), "crashy"), Job(tiny(2), "crashy"), Job(tiny(1, seed=9), "crashy")]
    search = LimitSearch("batch_size", 3, 4, "crashy", tiny(3))  # probes 3 (ok), 4 (crash)
    rows = runner.run(jobs, [search])

    written = read_rows(tmp_path)
    key = lambda r: (r["kind"], r["case_id"], r["backend"], r["status"])
    kept = [r for r in written if "limit-probe" not in r.get("tags", ())]
    assert sorted(map(key, kept)) == sorted(map(key, rows))  # every row, written once
    plain = [r for r in written if r["kind"] == "case" and "limit-probe" not in r["tags"]]
    status = {(r["params"]["batch_size"], r["params"]["seed"], r["backend"]): r for r in plain}
    assert {k: r["status"] for k, r in status.items()} == {
        (1, 0, "torch"): "ok",
        (1, 1, "torch"): "ok",
        (1, 2, "torch"): "ok",
        (4, 0, "crashy"): "crash",
        (2, 0, "crashy"): "ok",
        (1, 9, "crashy"): "ok",
    }
    (limit,) = [r for r in written if r["kind"] == "limit"]
    assert (limit["last_ok"], limit["first_fail"]) == (3, 4)
    probes = [r for r in written if "limit-probe" in r.get("tags", ())]
    assert len(probes) == 2
    assert len({r["env"]["slot"] for r in [*probes, limit]}) == 1  # one search, one slot
    # the search starts first on one slot; the other slot takes jobs meanwhile
    assert {r["env"]["slot"] for r in plain} - {limit["env"]["slot"]}
    # every worker, the one restarted after the crash and each probe's included, was pinned to
    # its own slot's device
    assert all(pinned == f"{10 + slot}" for slot, pinned in made.started)
    assert len(made.started) >= 1 + 1 + 2  # a worker for jobs, its restart, two probes
    assert all(not w.alive() for w in made.workers)  # the run stopped them all


def test_an_interrupt_stops_every_slot_and_writes_no_row_for_cut_jobs(tmp_path, monkeypatch):
    hanging = tmp_path / "hanging"
    monkeypatch.setenv("CRASHY_HANGING", str(hanging))
    made = Recorder()
    runner = Runner(
        ResultWriter(tmp_path / "run"),
        arch="cpu",
        plugins=[PLUGIN],
        progress=False,
        devices=devices.cpu_slots(2),
        worker_factory=made,
    )
    jobs = [Job(tiny(b, seed=3), "crashy") for b in (1, 2)]  # both hang (seed 3)

    def interrupt():
        deadline = time.monotonic() + 60
        # both slots must have started a worker: under load the second can lag the first hang
        while (not hanging.exists() or len(made.started) < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        runner.run(jobs)
    assert hanging.exists()
    assert sorted(slot for slot, _ in made.started) == [0, 1]  # one job on each slot
    assert read_rows(tmp_path / "run") == []  # killed by the stop: no crash rows
    assert made.workers and all(not w.alive() for w in made.workers)


GPUS = [
    Device(slot=i, index=i, name="NVIDIA H200", uuid=f"GPU-{i}", arch="sm90", visible=str(i))
    for i in range(4)
]


def test_gpus_select_devices_and_refuse_bad_lists():
    assert [d.index for d in devices.select("all", GPUS)] == [0, 1, 2, 3]
    chosen = devices.select("3,1", GPUS)
    assert [(d.slot, d.index, d.visible) for d in chosen] == [(0, 3, "3"), (1, 1, "1")]
    assert chosen[0].row_env() == {
        "slot": 0,
        "gpu_index": 3,
        "gpu_uuid": "GPU-3",
        "gpu": "NVIDIA H200",
    }
    assert chosen[0].worker_env() == {"CUDA_VISIBLE_DEVICES": "3"}
    for spec, why in [
        ("4", "no GPU 4"),
        ("0,0", "named twice"),
        ("one", "expected 'all'"),
        ("-1", "no GPU -1"),
    ]:
        with pytest.raises(DeviceError, match=why):
            devices.select(spec, GPUS)
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        devices.select("all", [])
    mixed = [GPUS[0], replace(GPUS[1], name="NVIDIA H100 80GB HBM3")]
    with pytest.raises(DeviceError, match="different models"):
        devices.select("all", mixed)
    assert devices.uuid_text("abc-1") == "GPU-abc-1"
    assert devices.cpu_slots(1)[0].row_env() == {"slot": 0}


class _FakeWorker:
    def __init__(self):
        self.stopped = False

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True


def test_a_slot_keeps_at_most_max_pooled_workers_least_recently_used_first():
    from dsv4bench.run import runner

    made = []
    slot = runner.Slot(None, lambda device: made.append(_FakeWorker()) or made[-1])
    keys = [f"build-{i}" for i in range(runner.MAX_POOLED)]
    for key in keys:
        slot.ensure_worker(key)
    first = slot.ensure_worker(keys[0])  # used again: now the most recent
    assert first is made[0] and len(made) == runner.MAX_POOLED
    slot.ensure_worker("one-more")  # the least recently used (keys[1]) stops
    assert made[1].stopped and not made[0].stopped and len(slot.workers) == runner.MAX_POOLED
    slot.stop_pooled()  # a limit search starts: none left holding the device
    assert all(w.stopped for w in made) and not slot.workers


def test_an_idle_worker_drops_large_inputs_and_keeps_small_ones():
    """Between jobs a worker keeps its last case's inputs for the next backend of that case
    only when they are small; large ones would sit on the GPU beside other builds' workers."""
    import torch

    from dsv4bench.run.worker import Cache, release

    cache = Cache()
    cache.key, cache.inputs, cache.expected = "c", {"kv": torch.zeros(256)}, {None: "out"}
    release(cache, limit=2048)  # 1024 bytes held
    assert cache.key == "c" and "kv" in cache.inputs and cache.expected
    cache.inputs["q"] = torch.zeros(512)  # 3072 bytes
    release(cache, limit=2048)
    assert cache.key is None and not cache.inputs and not cache.expected


def test_jobs_of_more_builds_than_a_slot_keeps_run_build_by_build():
    """Five builds in case order would stop and start a worker for every job (the H100 failure
    run: 21 of 75 jobs in 120 s); grouped, each build's worker starts once."""
    from dsv4bench.run import runner
    from dsv4bench.run.slot import grouped_for_pool

    builds = [f"build-{i}" for i in range(runner.MAX_POOLED + 2)]
    units = [(case, b) for case in range(4) for b in builds] + [("search", None)]

    def starts(order):
        made = []
        slot = runner.Slot(None, lambda device: made.append(_FakeWorker()) or made[-1])
        for _, key in order:
            if key is not None:
                slot.ensure_worker(key)
        return len(made)

    grouped = grouped_for_pool(units, key=lambda u: u[1])
    assert sorted(grouped, key=str) == sorted(units, key=str)
    assert starts(units) == len(units) - 1 and starts(grouped) == len(builds)
    assert grouped[0] == ("search", None)  # keyless units first, in their order
    assert [c for c, b in grouped if b == "build-0"] == [0, 1, 2, 3]  # case order kept
    few = [(case, b) for case in range(3) for b in builds[: runner.MAX_POOLED]]
    assert grouped_for_pool(few, key=lambda u: u[1]) == few  # within the pool: case order
