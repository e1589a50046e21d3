"""Instances of one backend side by side (two FlashMLA builds in one run): per instance its
measured limits, its speed against the first instance (geometric mean of time ratios over the
cases both ran ok, each pair by the timer both rows measured: rows/timers.py) and its
accuracy (largest cos_diff)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsv4bench.report.limit_lanes import merge_limits
from dsv4bench.report.load import is_probe, last_case_rows, param
from dsv4bench.rows import timers


@dataclass
class Limit:
    """One limit row of an instance, named by what it searched."""

    what: str  # e.g. "decode-kernel v4-flash h64 tokens"
    last_ok: int | None
    first_fail: int | None
    status: str
    step: int = 1

    def text(self) -> str:
        if self.first_fail is None and self.last_ok is None:
            return f"not searched ({self.status})"
        if self.first_fail is None:
            return f"no failure up to {self.last_ok}"
        if self.last_ok is None:
            return f"fails already at {self.first_fail} ({self.status})"
        exact = "" if self.first_fail - self.last_ok <= 1 else f" (to {self.step})"
        return f"last ok {self.last_ok}, first fail {self.first_fail}{exact} ({self.status})"


@dataclass
class Instance:
    name: str
    base: str  # the backend it is an instance of
    reference: str  # the instance its speed is relative to
    cases: int = 0
    ok: int = 0
    incorrect: int = 0
    unsupported: int = 0
    reasons: list[str] = field(default_factory=list)  # distinct `unsupported` messages
    max_cos_diff: float | None = None
    ratios: list[float] = field(default_factory=list)  # its time / the reference's, per case
    timers: set[str] = field(default_factory=set)  # the timers those ratios divide
    limits: list[Limit] = field(default_factory=list)

    @property
    def speed(self) -> float | None:
        """Geometric mean of the time ratios (< 1: faster than the reference)."""
        if not self.ratios:
            return None
        return math.exp(sum(math.log(x) for x in self.ratios) / len(self.ratios))


def _limit_name(r: dict) -> str:
    route = f"{param(r, 'route')} " if r.get("op") == "prefill" else f"{r.get('op')} "
    return f"{route}{param(r, 'model')} h{param(r, 'num_heads')} {r.get('axis')}"


def instance_groups(rows: list[dict]) -> list[list[Instance]]:
    """Per (run, base backend) with two or more instances: the instances, sorted by name; the
    first is everyone's reference."""
    by_base: dict[tuple, set[str]] = {}
    for r in rows:
        if r.get("kind") in ("case", "limit") and r.get("backend"):
            base = r.get("backend_base") or r["backend"]
            by_base.setdefault((r.get("_run"), base), set()).add(r["backend"])
    groups = []
    for (run, base), names in sorted(by_base.items(), key=lambda kv: str(kv[0])):
        if len(names) < 2:
            continue
        names = sorted(names)
        mine = [r for r in rows if r.get("_run") == run and r.get("backend") in names]
        groups.append([_summarize(name, base, names[0], mine) for name in names])
    return groups


def _summarize(name: str, base: str, reference: str, rows: list[dict]) -> Instance:
    inst = Instance(name, base, reference)
    ref_rows = {
        r["case_id"]: r
        for r in last_case_rows(rows)
        if r["backend"] == reference and r["status"] == "ok" and not is_probe(r)
    }
    for r in last_case_rows(rows):  # a case re-run or re-judged counts once, by its last row
        if r["backend"] != name or is_probe(r):
            continue
        if r["status"] == "unsupported":
            inst.unsupported += 1
            if r.get("message") and r["message"] not in inst.reasons:
                inst.reasons.append(r["message"])
            continue
        inst.cases += 1
        inst.ok += r["status"] == "ok"
        inst.incorrect += r["status"] == "incorrect"
        cos = (r.get("accuracy") or {}).get("cos_diff")
        if isinstance(cos, (int, float)) and math.isfinite(cos):
            inst.max_cos_diff = cos if inst.max_cos_diff is None else max(inst.max_cos_diff, cos)
        ref = ref_rows.get(r["case_id"])
        timer = timers.shared([r, ref]) if r["status"] == "ok" and ref else None
        if timer:
            inst.ratios.append(timers.value(r, timer[0]) / timers.value(ref, timer[0]))
            inst.timers.add(timer[1])
    for r in merge_limits(rows):
        if r.get("kind") == "limit" and r["backend"] == name:
            inst.limits.append(
                Limit(
                    _limit_name(r),
                    r.get("last_ok"),
                    r.get("first_fail"),
                    str(r.get("status")),
                    int(r.get("step") or 1),
                )
            )
    inst.limits.sort(key=lambda lim: lim.what)
    return inst


def paragraph(inst: Instance) -> str:
    """What one instance measured, in one sentence per fact."""
    parts = [f"**{inst.name}**: {inst.ok} of {inst.cases} cases ok"]
    if inst.incorrect:
        parts[-1] += f", {inst.incorrect} incorrect"
    if inst.unsupported:
        parts[-1] += f", {inst.unsupported} unsupported ({' / '.join(inst.reasons)})"
    if inst.max_cos_diff is not None:
        parts.append(f"max cos_diff {inst.max_cos_diff:.3g}")
    if inst.name != inst.reference and inst.speed is not None:
        lo, hi = min(inst.ratios), max(inst.ratios)
        parts.append(
            f"time {inst.speed:.3f}x {inst.reference}'s (geometric mean over {len(inst.ratios)} "
            f"cases, {lo:.2f}..{hi:.2f}; {' / '.join(sorted(inst.timers))})"
        )
    for lim in inst.limits:
        parts.append(f"{lim.what} limit: {lim.text()}")
    return "; ".join(parts) + "."
