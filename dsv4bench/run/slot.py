"""One device and its long-lived worker processes (run/runner.py hands jobs to slots)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4bench.run.devices import Device

Worker = Any  # run/runner.py's Worker: a process with alive(), stop(), wait_ready()

# Workers a slot keeps alive at once: each holds its own CUDA context and cached memory (about
# 12 GiB after the sm90 cases on an H100), so seven builds' workers side by side left a limit
# probe out of memory; past this many the least recently used one stops.
MAX_POOLED = 3


def grouped_for_pool(units: list, key: Callable[[Any], str | None]) -> list:
    """`units` with the jobs of one worker key side by side (in the order each key first
    appears), where the run needs more workers than a slot keeps: in case order, jobs of
    MAX_POOLED + 1 builds would stop and start a worker for every job. Units whose key is None
    keep their places relative to each other, first."""
    keys = [key(u) for u in units]
    if len({k for k in keys if k is not None}) <= MAX_POOLED:
        return list(units)
    order: dict[str, int] = {}
    for k in keys:
        if k is not None:
            order.setdefault(k, len(order))
    ranked = sorted(range(len(units)), key=lambda i: -1 if keys[i] is None else order[keys[i]])
    return [units[i] for i in ranked]


class Slot:
    """One device and its long-lived workers, one per Backend.process_key (two builds of one
    kernel library cannot share a process); a worker that dies is replaced on the same device."""

    def __init__(
        self,
        device: Device,
        factory: Callable[[Device], Worker],
        spawn: Callable[[Device], Worker] | None = None,
    ):
        """`spawn`: a factory that returns a worker still starting (Worker(wait=False)), for
        fresh_worker's spare."""
        self.device = device
        self._factory = factory
        self._spawn = spawn
        self._spare: Worker | None = None
        self.workers: dict[str, Worker] = {}

    def new_worker(self) -> Worker:
        return self._factory(self.device)

    def fresh_worker(self) -> Worker:
        """A new worker process for one job (a limit probe). Its interpreter, torch import and
        backend setup (seconds) happened while the previous probe ran: the next one starts
        now, in this thread (a worker dies with the thread that started it). A spare holds no
        CUDA context until its first job, so it takes no device memory from the probe."""
        spare, self._spare = self._spare, None
        worker = None
        if spare is not None:
            try:
                spare.wait_ready()
                worker = spare
            except RuntimeError:
                pass  # a spare that could not start: start one the usual way
        worker = worker or self.new_worker()
        if self._spawn is not None:
            self._spare = self._spawn(self.device)
        return worker

    def ensure_worker(self, key: str = "") -> Worker:
        worker = self.workers.pop(key, None)
        if worker is None or not worker.alive():
            if worker is not None:
                worker.stop()
            while len(self.workers) >= MAX_POOLED:  # the least recently used goes first
                self.workers.pop(next(iter(self.workers))).stop()
            worker = self.new_worker()
        self.workers[key] = worker  # last: the most recently used
        return worker

    def stop_pooled(self) -> None:
        """Stop the long-lived workers (a limit search's probes get the device to themselves)."""
        for worker in self.workers.values():
            worker.stop()
        self.workers.clear()

    def drop(self, worker: Worker) -> None:
        """Forget a stopped worker (the next job of its key starts a new one)."""
        for key, w in list(self.workers.items()):
            if w is worker:
                del self.workers[key]

    def close(self) -> None:
        for worker in [*self.workers.values(), *([self._spare] if self._spare else [])]:
            worker.stop()
        self.workers.clear()
        self._spare = None
