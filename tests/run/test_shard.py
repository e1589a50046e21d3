"""--shard I/N: shards partition the jobs exactly, deterministically, balanced by cost."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4bench import backends
from dsv4bench.cases.case import Case
from dsv4bench.run import shard
from dsv4bench.run.runner import Job
from dsv4bench.scenarios import LimitSearch

ROOT = Path(__file__).resolve().parents[2]
SM90 = sorted(str(p) for p in (ROOT / "scenarios" / "sm90").glob("*.yaml"))


@pytest.fixture(scope="module")
def sm90_units():
    from dsv4bench import cli

    backends.setup([])
    jobs, limits, _ = cli._load(SM90, None)
    return jobs, limits


def keys(units) -> set:
    return {shard.unit_key(u) for u in units}


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 400])
def test_shards_partition_the_jobs_exactly(sm90_units, count):
    jobs, limits = sm90_units
    parts = shard.split(jobs, limits, count)
    assert parts[-1] == shard.select(jobs, limits, shard.Shard(count, count))
    seen: set = set()
    for part_jobs, part_limits in parts:
        mine = keys(part_jobs) | keys(part_limits)
        assert not mine & seen  # pairwise disjoint
        seen |= mine
    assert seen == keys(jobs) | keys(limits)  # union = all
    assert sum(len(j) + len(s) for j, s in parts) == len(jobs) + len(limits)
    units = len(keys(jobs) | keys(limits))  # a job listed twice (two files) is one unit
    if count > units:  # more shards than units: some are empty, none lost
        assert sum(1 for j, s in parts if not j and not s) == count - units


def test_the_split_does_not_depend_on_file_order(sm90_units):
    jobs, limits = sm90_units
    shuffled = list(jobs)
    random.Random(7).shuffle(shuffled)
    ordered = [shard.unit_key(j) for j in jobs]
    for a, b in zip(
        shard.split(jobs, limits, 3), shard.split(shuffled, limits[::-1], 3), strict=True
    ):
        assert keys(a[0]) == keys(b[0]) and keys(a[1]) == keys(b[1])
        mine = keys(a[0])  # and a shard keeps the run's own order
        assert [shard.unit_key(j) for j in a[0]] == [k for k in ordered if k in mine]


@pytest.mark.parametrize("count", [2, 3, 4, 6])
def test_shipped_sm90_set_is_balanced_by_cost(sm90_units, count):
    """Each shard's expected cost is within 5% of the mean, unless it is a limit search
    alone (a search is one unit: its probes bisect on one GPU)."""
    jobs, limits = sm90_units
    units = [*jobs, *limits]
    costs = {shard.unit_key(u): shard.unit_cost(u, shard._is_oracle) for u in units}
    where = shard.assign(units, count, shard._is_oracle)
    loads = [0] * count
    for key, i in where.items():
        loads[i - 1] += costs[key]
    mean = sum(loads) / count
    largest = max(costs.values())
    for load in loads:
        assert load <= 1.05 * mean or load == largest
    # shards of jobs only (not the one holding the search) are even among themselves
    rest = [load for load in loads if load != largest] or loads
    assert max(rest) <= 1.05 * (sum(rest) / len(rest))
    if count == 2:
        assert max(loads) <= 1.01 * mean
    # by count alone the split would be far off: one prefill outweighs many decodes
    assert len({len([k for k in where if where[k] == i]) for i in range(1, count + 1)}) > 1


def test_the_cost_model_follows_the_work():
    small = Case(
        scenario="t", op="decode", model="v3.2", d_qk=576, d_v=512, num_heads=64, batch_size=1
    )
    big = replace(small, batch_size=128)
    prefill = replace(small, op="prefill", tokens=32768, batch_size=1)
    assert shard.case_cost_ms(small) < shard.case_cost_ms(big) < shard.case_cost_ms(prefill)
    # the oracle as the timed backend pays for its timed calls
    assert shard.case_cost_ms(big, oracle_backend=True) > 10 * (
        shard.case_cost_ms(big) - shard.JOB_MS
    )
    search = LimitSearch("tokens", 8192, 16384, "flashmla", replace(prefill, tokens=8192))
    assert shard.limit_cost_ms(search) > 14 * shard.START_MS  # 16 probes, each a new process
    jobs = [Job(small, "torch"), Job(small, "torch")]  # the same job twice is one unit
    assert shard.assign(jobs, 2, lambda b: True) == {shard.unit_key(jobs[0]): 1}


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2"])
def test_bad_shards_are_refused(text):
    with pytest.raises(shard.ShardError, match="--shard"):
        shard.parse(text)


def test_a_shard_reads_as_written():
    assert str(shard.parse(" 2 / 5 ")) == "2/5"
