"""Limit searches of one lane joined into one limit row.

A lane is one backend instance searching one axis of one case (every param but the searched
axis equal). A lane may hold several searches: a `--resume` that adds a wider range after a
first search found no failure, or two builds whose searches started at different sizes. Their
probes together bound the limit; reports and `compare` read the joined row, so a superseded
"no failure up to N" is not shown beside the limit that a later search found, and two
instances' searches of one lane are compared even when their ranges differed.
"""

from __future__ import annotations

import hashlib
import json


def lane_key(r: dict) -> tuple:
    params = {k: v for k, v in (r.get("params") or {}).items() if k != r.get("axis")}
    return (
        r.get("_run"),
        r.get("backend"),
        r.get("op"),
        r.get("axis"),
        json.dumps(params, sort_keys=True, default=str),
    )


def lane_id(r: dict) -> str:
    """A readable name of the lane, the same for every instance (backend and run left out)."""
    p = r.get("params") or {}
    others = {k: v for k, v in p.items() if k != r.get("axis")}
    digest = hashlib.sha1(
        json.dumps([r.get("op"), others], sort_keys=True, default=str).encode()
    ).hexdigest()[:8]
    route = f"-{p['route']}" if r.get("op") == "prefill" and p.get("route") else ""
    heads = f"-h{p['num_heads']}" if p.get("num_heads") is not None else ""
    return f"limit-{r.get('axis')}-{r.get('op')}-{p.get('model', '?')}{route}{heads}-{digest}"


def merge_limits(rows: list[dict]) -> list[dict]:
    """The rows with every lane's limit rows replaced by one (at the first one's place)."""
    lanes: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "limit":
            lanes.setdefault(lane_key(r), []).append(r)
    out, done = [], set()
    for r in rows:
        if r.get("kind") != "limit":
            out.append(r)
            continue
        key = lane_key(r)
        if key not in done:
            done.add(key)
            group = lanes[key]
            out.append(group[0] if len(group) == 1 else _joined(group))
    return out


def _joined(group: list[dict]) -> dict:
    probes: dict[int, str] = {}
    oks, fails = [], []
    for r in group:
        for value, status in (r.get("probes") or {}).items():
            probes[int(value)] = status
        if r.get("last_ok") is not None:
            oks.append(int(r["last_ok"]))
        if r.get("first_fail") is not None:
            fails.append(int(r["first_fail"]))
    oks += [v for v, s in probes.items() if s == "ok"]
    fails += [v for v, s in probes.items() if s != "ok"]
    first_fail = min(fails) if fails else None
    below = [v for v in oks if first_fail is None or v < first_fail]
    last_ok = max(below) if below else None
    # the row that found the first failure names its status and message
    source = next(
        (r for r in group if first_fail is not None and r.get("first_fail") == first_fail),
        group[-1],
    )
    joined = {
        **source,
        "last_ok": last_ok,
        "first_fail": first_fail,
        "probes": {str(v): probes[v] for v in sorted(probes)},
        "step": min(int(r.get("step") or 1) for r in group),
        "info": {**(source.get("info") or {}), "searches": [r.get("case_id") for r in group]},
    }
    if first_fail is None:
        joined.update(status="ok", message=f"no failure up to {last_ok}")
    return joined
