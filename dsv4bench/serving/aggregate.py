"""Serving rows (TTFT/TPOT points) from measured case rows: one per curve point and backend,
plus, where several backends have attention rows, one per point for ENVELOPE: every attention
part on the fastest backend that ran it ok (per layer kind and chunk shape; never the oracle),
what an engine could reach by picking the best kernel per call.

A point sums its parts' times by the run's timer (rows.timers, the winners' rule): the first of
the profiler makespan, the graph replay and the events median that every ok kernel row of the
plan measured (the oracle's rows, which skip the profiler pass, are a baseline and do not
count). A point with a part that has no such time (one of the oracle's own points, a helper
part only the oracle ran) sums events medians instead. Each serving row names its timer
(`timer`) and carries its parts' events medians summed beside (`events_ms`), the kernel each
part took where its row names one (`parts[].kernel`: the engine helper a dequant, remap or
cache_write part sums), what a point does not sum that its spec asked for (`message`: no
helper backend writes the cache) and the route's workspace (`workspace_mib`, serving.planning
helper_bytes)."""

from __future__ import annotations

from dsv4bench.cases import topk_case
from dsv4bench.measure import split
from dsv4bench.rows import ORACLE_BACKENDS, ServingRow, is_oracle_row, timers
from dsv4bench.scenarios.serving_spec import LABEL, LABEL_INDEXER, ROLES, WRITER
from dsv4bench.serving.planning import Part, ServingPlan

ENVELOPE = "envelope"  # the backend name of the fastest-per-part rows

# ---- aggregation ----------------------------------------------------------------------------


def _usable(row: dict | None, key: str) -> bool:
    return row is not None and row.get("status") == "ok" and timers.value(row, key) is not None


EVENTS = (timers.EVENTS, timers.NAMES[timers.EVENTS])


def run_timer(plan: ServingPlan, rows: list[dict]) -> tuple[str, str]:
    """(timing key, name) that every ok kernel row (the oracle's aside) of the plan's cases
    measured; events if none."""
    cases = {c.case_id for c in plan.cases}
    ok = [
        r
        for r in rows
        if r.get("kind", "case") == "case"
        and r.get("case_id") in cases
        and r.get("status") == "ok"
        and not is_oracle_row(r)
    ]
    return timers.shared(ok) or EVENTS


def aggregate(plan: ServingPlan, rows: list[dict], *, envelope: bool = True) -> list[dict]:
    """Serving rows, one per (curve point, backend), from case rows of a run; with `envelope`
    and more than one attention backend, also one ENVELOPE row per point."""
    key, timer = run_timer(plan, rows)
    by_key: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r.get("kind", "case") == "case" and "case_id" in r and "backend" in r:
            by_key[(r["case_id"], r["backend"])] = r  # a later row (a rerun) wins
    by_case: dict[str, list[dict]] = {}
    for (cid, _), r in by_key.items():
        by_case.setdefault(cid, []).append(r)

    attention = {c.case_id for c in plan.cases if c.op in ("prefill", "decode")}
    backends = list(plan.spec.backends)
    if not backends:
        backends = sorted({b for (cid, b) in by_key if cid in attention})

    # the envelope's attention parts come from the attention backends only, never the oracle
    # (a baseline: its rows are timed, but an engine cannot pick it)
    candidates = [b for b in backends if b not in ORACLE_BACKENDS]
    fastest_of = {
        cid: [r for r in rs if cid not in attention or r["backend"] in candidates]
        for cid, rs in by_case.items()
    }
    if envelope and len(candidates) > 1:
        backends = [*backends, ENVELOPE]
    out = []
    for curve in plan.curves:
        for point in curve.points:
            for backend in backends:
                pool = fastest_of if backend == ENVELOPE else by_case
                out.append(_point_row(plan, curve, point, backend, by_key, pool, (key, timer)))
    return out


def _pick(
    part: Part, backend: str, by_key: dict, by_case: dict, key: str
) -> tuple[str | None, dict | None]:
    """The row a part takes: the backend's own (attention), the fastest ok one (dequant, remap,
    indexer; and attention parts of the ENVELOPE, among the attention backends)."""
    if part.role == "attention" and backend != ENVELOPE:
        return backend, by_key.get((part.case_id, backend))
    candidates = by_case.get(part.case_id, [])
    ok = [r for r in candidates if _usable(r, key)]
    if ok:
        best = min(ok, key=lambda r: (timers.value(r, key), r["backend"] != backend, r["backend"]))
        return best["backend"], best
    own = by_key.get((part.case_id, backend))
    failed = own or (sorted(candidates, key=lambda r: r["backend"])[0] if candidates else None)
    return (failed["backend"] if failed else None), failed


def indexer_stages_ms(parts: list[dict], by_key: dict, key: str = timers.EVENTS) -> dict | None:
    """{"indexer_logits": ms, "indexer_topk": ms} of a point: per indexer part the split of the
    very row its indexer time came from (measure/split.py: the logits alone, and the call
    minus them), times the part's multiplicity, summed; they add up to breakdown_ms.indexer.
    None unless every indexer part's row has a split by `key`."""
    found = {"indexer_logits": 0.0, "indexer_topk": 0.0}
    ix = [p for p in parts if p["role"] == "indexer"]
    for p in ix:
        row = by_key.get((p["case_id"], p["backend"]))
        for name, stage in (("indexer_logits", "logits_ms"), ("indexer_topk", "topk_ms")):
            ms = split.stage_ms(row, stage, key)
            if ms is None:
                return None
            found[name] += p["multiplicity"] * ms
    return found if ix else None


def topk_alone_ms(
    plan: ServingPlan, point, by_case: dict, key: str = timers.EVENTS
) -> float | None:
    """What the fastest top-k kernel alone costs for a point's indexer parts, from `topk` rows:
    per indexer part the fastest ok row of its top-k alone (topk_case.of_indexer: the same
    shape, plain form), times the part's multiplicity, summed; None unless every indexer part
    has such a row. Beside the indexer's own top-k (indexer_topk), never added to the total."""
    total, found = 0.0, False
    for part in (p for p in point.parts if p.role == "indexer"):
        twin = topk_case.of_indexer(plan.case(part.case_id)).case_id
        ok = [r for r in by_case.get(twin, []) if _usable(r, key)]
        if not ok:
            return None
        total += part.multiplicity * min(timers.value(r, key) for r in ok)
        found = True
    return total if found else None


def _point_row(plan, curve, point, backend, by_key, by_case, timer: tuple[str, str]) -> dict:
    """One point's serving row (a ServingRow, checked, as the dict a results file holds), its
    parts summed by `timer` (timing key, name), or by events where a part has no such time
    but every part has an events median."""
    row = _summed(plan, curve, point, backend, by_key, by_case, timer)
    if row["status"] != "ok" and timer != EVENTS:
        by_events = _summed(plan, curve, point, backend, by_key, by_case, EVENTS)
        if by_events["status"] == "ok":
            return by_events
    return row


def _summed(plan, curve, point, backend, by_key, by_case, timer: tuple[str, str]) -> dict:
    key = timer[0]
    parts, total, events, status, message, env = [], 0.0, 0.0, "ok", "", None
    writes = any(p.role == WRITER for p in point.parts)
    breakdown = dict.fromkeys((*ROLES, WRITER) if writes else ROLES, 0.0)
    for part in point.parts:
        used, row = _pick(part, backend, by_key, by_case, key)
        median = timers.value(row, key) if row is not None else None
        if row is None:
            p_status, p_msg = "missing", f"no result row for {part.case_id} on {backend}"
        elif row.get("status") == "ok" and median is None:
            p_status, p_msg = "missing", f"{part.case_id} on {used}: row has no {timer[1]} time"
        else:
            p_status, p_msg = row.get("status", "error"), row.get("message") or ""
        if p_status == "ok":
            total += part.multiplicity * median
            breakdown[part.role] += part.multiplicity * median
            events = None if events is None else _add(events, part.multiplicity, row)
        elif status == "ok":
            status = p_status
            where = f"{part.case_id} on {used or backend}"
            message = f"{where}: {p_status}" + (f": {p_msg}" if p_msg else "")
            if p_status == "missing":
                message = p_msg
        if env is None and row is not None and row.get("env"):
            env = row["env"]
        parts.append(
            {
                "case_id": part.case_id,
                "multiplicity": part.multiplicity,
                "role": part.role,
                "backend": used,
                "ms": median,
                "status": p_status,
            }
        )
        if key != timers.EVENTS and p_status == "ok":
            parts[-1]["events_ms"] = timers.events_ms(row)
        kernel = ((row or {}).get("info") or {}).get("kernel")
        if kernel:  # which of the backend's kernels the part took (vllm-ops has several)
            parts[-1]["kernel"] = kernel
    ok = status == "ok"
    if ok and breakdown["indexer"]:  # parts of the indexer's time, never added to the total
        breakdown.update(indexer_stages_ms(parts, by_key, key) or {})
        alone = topk_alone_ms(plan, point, by_case, key)
        if alone is not None:
            breakdown["topk_alone"] = alone
    spec = plan.spec
    return ServingRow(
        scenario=spec.scenario,
        case_id=point.point_id,
        curve_id=curve.curve_id,
        model=spec.model,
        metric=point.metric,
        backend=backend,
        route=point.route,
        threshold=point.threshold,
        dequant=point.dequant,
        c128_index=point.c128_index,
        prompt_len=point.prompt_len,
        chunk_size=point.chunk_size,
        batch_size=point.batch_size,
        context_len=point.context_len,
        num_heads=spec.heads,
        tp=spec.tp,
        value_ms=total if ok else None,
        breakdown_ms=breakdown if ok else None,
        status=status,
        message="; ".join(m for m in (message, point.not_summed) if m),
        parts=parts,
        label=LABEL_INDEXER if spec.indexer else LABEL,
        env=env,
        timer=timer[0],
        events_ms=events if ok else None,
        workspace_mib=round(point.workspace_bytes / 2**20, 3),
    ).to_dict()


def _add(events: float, multiplicity: int, row: dict) -> float | None:
    """The events sum with one more part; None once a part has no events median."""
    ms = timers.events_ms(row)
    return None if ms is None else events + multiplicity * ms
