"""`--shard I/N`: the part of a run one of N machines does, balanced by expected cost.

A limit search is one unit (its probes bisect one after another, on one GPU). Units are split
by a cost model, not by count: one 32K-token prefill costs what a hundred small decodes cost.
The split depends only on the units themselves (ids and sizes), never on the order of scenario
files, hash seeds or the machine, so N machines given the same command agree on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from dsv4bench.cases.case import Case
from dsv4bench.measure import metrics

JOB_MS = 250  # per job: dispatch, inputs, the correctness call, the row
START_MS = 8000  # a fresh worker (every limit probe): interpreter, torch, CUDA context, library
ORACLE_FLOP_PER_MS = 4_000_000_000  # the oracle on an H100: ~4 TFLOP/s of fp32 attention math
ORACLE_BYTE_PER_MS = 200_000_000  # ~200 GB/s for what it gathers and writes
ORACLE_CALL_MS = 60  # host-bound part of an oracle call: syncs and ~60 small launches


class ShardError(ValueError):
    """A `--shard` value that is not I/N with 1 <= I <= N (one line for the user)."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1..count
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse(text: str) -> Shard:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m:
        raise ShardError(f"--shard {text}: expected I/N, e.g. 1/4")
    index, count = int(m[1]), int(m[2])
    if not 1 <= index <= count:
        raise ShardError(f"--shard {text}: I must be 1..N")
    return Shard(index, count)


def case_cost_ms(case: Case, *, oracle_backend: bool = False) -> int:
    """Expected milliseconds of one (case, backend) job on a GPU, as integers (the same on
    every machine). What it models: a fixed cost per job, plus the oracle computing the
    expected answer once, from the case's FLOPs and bytes (metrics.attention_flops and
    attention_bytes) and a fixed host cost per call; when the backend is the oracle itself, its
    warm-up and timed calls are oracle calls too. A kernel's own calls are left out: kernels
    are 20x and more faster than the oracle. On results/sm90/baseline-h100 (264 jobs) it predicts
    a total within 10% of the measured one; a Triton kernel's first-call compile is not in it."""
    flops = metrics.attention_flops(case)
    moved = metrics.attention_bytes(case)
    oracle_ms = ORACLE_CALL_MS + flops // ORACLE_FLOP_PER_MS + moved // ORACLE_BYTE_PER_MS
    calls = 1 + (1 + case.timing.warmup + case.timing.iters if oracle_backend else 0)
    return JOB_MS + oracle_ms * calls


def limit_cost_ms(search, *, oracle_backend: bool = False) -> int:
    """A limit search: its expected probes, each a fresh process plus one job at the middle
    of the searched range."""
    probes = 2 + max(0, ((search.hi - search.lo) // search.step).bit_length())
    middle = search.at((search.lo + search.hi) // 2)
    return probes * (START_MS + case_cost_ms(middle, oracle_backend=oracle_backend))


def unit_key(unit) -> tuple[str, str, str]:
    """A job or limit search by what it is, not where it came from."""
    if hasattr(unit, "limit_id"):
        return ("limit", unit.limit_id, unit.backend)
    return ("case", unit.case.case_id, unit.backend)


def unit_cost(unit, is_oracle: Callable[[str], bool]) -> int:
    if hasattr(unit, "limit_id"):
        return limit_cost_ms(unit, oracle_backend=is_oracle(unit.backend))
    return case_cost_ms(unit.case, oracle_backend=is_oracle(unit.backend))


def assign(units: list, count: int, is_oracle: Callable[[str], bool]) -> dict[tuple, int]:
    """unit key -> shard index (1..count): the costliest unit first, each to the least loaded
    shard (ties: the lower index). Units with the same key are one unit."""
    costs: dict[tuple, int] = {}
    for u in units:
        costs[unit_key(u)] = unit_cost(u, is_oracle)
    loads = [0] * count
    where = {}
    for key in sorted(costs, key=lambda k: (-costs[k], k)):
        i = min(range(count), key=lambda j: (loads[j], j))
        loads[i] += costs[key]
        where[key] = i + 1
    return where


def total_ms(units: list, is_oracle: Callable[[str], bool] | None = None) -> int:
    is_oracle = is_oracle or _is_oracle
    costs = {unit_key(u): unit_cost(u, is_oracle) for u in units}
    return sum(costs.values())


def split(jobs: list, limits: list, count: int, is_oracle: Callable[[str], bool] | None = None):
    """[(jobs, limit searches) of shard 1, ..., of shard `count`], each in the run's order."""
    where = assign([*jobs, *limits], count, is_oracle or _is_oracle)
    parts = [([], []) for _ in range(count)]
    for j in jobs:
        parts[where[unit_key(j)] - 1][0].append(j)
    for s in limits:
        parts[where[unit_key(s)] - 1][1].append(s)
    return parts


def select(jobs: list, limits: list, shard: Shard, is_oracle: Callable[[str], bool] | None = None):
    """The jobs and limit searches of `shard`, in their original order."""
    return split(jobs, limits, shard.count, is_oracle)[shard.index - 1]


def _is_oracle(backend: str) -> bool:
    from dsv4bench import backends

    return bool(getattr(backends.get(backend), "is_oracle", False))
