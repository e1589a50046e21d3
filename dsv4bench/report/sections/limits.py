"""The crash boundary: limit searches, their probes and the predicted limits.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.report import plots
from dsv4bench.report.fmt import (
    code_span,
)
from dsv4bench.report.limit_lanes import merge_limits
from dsv4bench.report.load import (
    case_rows,
    is_probe,
    param,
    short,
)

THRESHOLD_COLORS = {"sglang": "#9467bd", "predicted": "#ff7f0e"}
DECODE_ROUTES = ("decode-kernel", "decode-mixed")  # prefill routes through the decode kernel


def crash_boundary(rep) -> None:
    from dsv4bench.measure import hardware

    points = _status_points(rep)
    mixed = any(lane.endswith("decode-mixed") for lane, _ in points)
    limits = [r for r in merge_limits(rep.rows) if r["kind"] == "limit"]
    failed = any(_decode_route(r) and r["status"] != "ok" for r in case_rows(rep.rows))
    if not limits and not failed:  # every decode-route point ran: no boundary to draw
        rep.left_out.append("Crash boundary: no limit rows and no failed decode-route row.")
        return
    d = rep.doc
    if not any(_decode_route(r) for r in limits) and not failed:
        _limits_only(rep, limits)  # limits of other kinds: no engine threshold applies
        return
    d.heading("Crash boundary: decode-kernel route" + (" and decode-mixed" if mixed else ""))
    d.para(
        "FlashMLA's decode scheduler (the build in vLLM 0.26.0) needs `4*(5b+1)` bytes of "
        "shared memory for batch `b` (other builds may differ: the measured limits per lane); "
        "sglang's DSv4 path sends a prefill chunk to the decode kernel with `b` = chunk "
        f"tokens while `tokens <= {hardware.SGLANG_DSV4_THRESHOLD}`. vLLM's mixed batch "
        "(route decode-mixed, lanes marked so) sends it as one request of `s_q` = chunk "
        "tokens, `b` = 1. Each point is one run "
        "in a fresh process; vertical lines are the engine threshold, the limit predicted "
        "from the GPU's per-block shared memory, and the measured limit per lane."
    )
    predicted = _predicted_limits(rep)
    _figure(rep, points, limits, predicted)
    if predicted:
        d.bullets(
            [_predicted_sentence(lim, smem, where) for lim, (smem, where) in predicted.items()]
        )
    if limits:
        d.bullets([_limit_sentence(r, predicted) for r in limits])
        _limit_table(rep, limits)
    d.table(
        ["lane", "size", "status", "row", "message"],
        [
            [lane, x, st, code_span(cid), msg]
            for (lane, x), (st, cid, msg) in sorted(points.items())
        ],
        caption="Every point in the plot",
        folded=True,
    )


def _limits_only(rep, limits: list[dict]) -> None:
    """Limit searches that are not FlashMLA's decode-route chunk limit (a batch or context
    limit, any backend): where each stops, without the engine thresholds of that route."""
    rep.doc.heading("Crash boundary: measured limits")
    rep.doc.para(
        "Where each backend starts failing along the searched axis: a bisection between a size "
        "that works and one that fails, each probe in a fresh process."
    )
    rep.doc.bullets([_limit_sentence(r) for r in limits])
    _limit_table(rep, limits)


def _limit_table(rep, limits: list[dict]) -> None:
    rep.doc.table(
        ["lane", "axis", "last ok", "first fail", "status", "message", "probes"],
        [
            [_lane(rep, r), r.get("axis"), r.get("last_ok"), r.get("first_fail")]
            + [r["status"], short(r.get("message"), 120)]
            + [", ".join(f"{k}:{v}" for k, v in (r.get("probes") or {}).items())]
            for r in limits
        ],
        caption="Measured limits (bisection, fresh process per probe)",
    )


def _decode_route(r: dict) -> bool:
    """A chunk-size limit of a prefill route through the decode kernel (what sglang's
    threshold and FlashMLA's scheduler limit are about)."""
    return r.get("op") == "prefill" and param(r, "route") in DECODE_ROUTES


def _status_points(rep) -> dict[tuple[str, float], tuple[str, str, str]]:
    """(lane, size) -> (status, case_id, message) of the decode-kernel route rows, the limit
    probes among them."""
    points: dict[tuple[str, float], tuple[str, str, str]] = {}
    for r in case_rows(rep.rows):
        if r.get("op") == "prefill" and param(r, "route") in DECODE_ROUTES:
            x = param(r, "tokens")
        elif r.get("op") == "decode" and is_probe(r):
            x = param(r, "batch_size")
        else:
            continue
        if isinstance(x, (int, float)):
            points[(_lane(rep, r), x)] = (r["status"], r["case_id"], short(r.get("message")))
    for r in rep.rows:
        if r["kind"] != "limit":
            continue
        for value, status in (r.get("probes") or {}).items():
            try:
                x = int(value)
            except (TypeError, ValueError):
                continue
            points.setdefault((_lane(rep, r), x), (status, r["case_id"], "limit probe"))
    return points


def _figure(rep, points: dict, limits: list[dict], predicted: dict) -> None:
    """Status vs size per lane, with the engine threshold, the predicted and measured limits."""
    from dsv4bench.measure import hardware

    threshold = hardware.SGLANG_DSV4_THRESHOLD
    markers = [
        plots.Marker(threshold, f"sglang DSv4 threshold {threshold}", THRESHOLD_COLORS["sglang"])
    ]
    for limit, (smem, where) in sorted(predicted.items()):
        markers.append(
            plots.Marker(
                limit,
                f"predicted scheduler limit {limit} (smem opt-in {smem} B, {where})",
                THRESHOLD_COLORS["predicted"],
                style=":",
            )
        )
    for r in limits:
        lane = _lane(rep, r)
        if r.get("last_ok") is not None:
            markers.append(
                plots.Marker(r["last_ok"], "measured: last ok", "#2ca02c", lane=lane, style="-")
            )
        if r.get("first_fail") is not None:
            markers.append(
                plots.Marker(
                    r["first_fail"], "measured: first failure", "#d62728", lane=lane, style="-"
                )
            )
    spans = [
        plots.Span(
            _lane(rep, r),
            r["first_fail"],
            threshold,
            "fails, yet routed to the decode kernel by sglang",
            "#d62728",
        )
        for r in limits
        if r.get("first_fail") is not None and r["first_fail"] <= threshold and not _mixed(r)
    ]
    spts = [plots.StatusPoint(lane, x, st) for (lane, x), (st, _, _) in sorted(points.items())]
    axis_names = sorted({r.get("axis") or "tokens" for r in limits}) or ["tokens"]
    xlabel = (
        "chunk tokens = decode batch b"
        if axis_names == ["tokens"]
        else (" / ".join(axis_names) + " (decode batch b)")
    )
    mixed = any(p.lane.endswith("decode-mixed") for p in spts)
    fig = plots.status_figure(
        "Status vs size on the decode-kernel route" + (" and decode-mixed" if mixed else ""),
        spts,
        markers,
        xlabel,
        _zoom(spts, markers),
        spans,
    )
    rep.doc.image(rep.save(fig, "crash-boundary"), "crash boundary")


def _predicted_sentence(limit: int, smem: int, where: str) -> str:
    from dsv4bench.measure import hardware

    threshold = hardware.SGLANG_DSV4_THRESHOLD
    if limit < threshold:
        verdict = (
            f"leaves {len(hardware.sglang_crash_batches(smem))} chunk sizes "
            f"({limit + 1}..{threshold}) that it routes to the "
            "decode kernel and that cannot be scheduled."
        )
    else:
        verdict = "is within it."
    return (
        f"Predicted: `floor(({smem}/4 - 1)/5)` = **{limit}** ({where}); sglang's "
        f"threshold {threshold} " + verdict
    )


def _lane(rep, r: dict) -> str:
    model = param(r, "model") or "?"
    return f"{rep.who(r)} · {model}" + (" · decode-mixed" if _mixed(r) else "")


def _mixed(r: dict) -> bool:
    """A row of vLLM's mixed-batch route: b = 1, so sglang's threshold does not apply."""
    return r.get("op") == "prefill" and param(r, "route") == "decode-mixed"


def _predicted_limits(rep) -> dict[int, tuple[int, str]]:
    """Scheduler limits predicted from the runs' per-block shared memory: the value the
    device reported (env smem_per_block_optin), else the GPU table's."""
    from dsv4bench.measure import hardware

    found: dict[int, tuple[int, str]] = {}
    for r in rep.rows:
        env = r.get("env") or {}
        smem, where = env.get("smem_per_block_optin"), env.get("gpu") or "device"
        if not smem and env.get("gpu"):
            spec = hardware.lookup(str(env["gpu"]))
            smem = spec.smem_per_block_optin if spec else None
            where = f"{env['gpu']}, from the GPU table"
        if isinstance(smem, int) and smem > 0:
            found.setdefault(hardware.flashmla_sched_batch_limit(smem), (smem, where))
    return found


def _zoom(points, markers) -> tuple[float, float] | None:
    marks = [m.x for m in markers]
    lo, hi = min(marks), max(marks)
    pad = max(24.0, 0.25 * (hi - lo))
    lo, hi = lo - pad, hi + pad
    inside = [p for p in points if lo <= p.x <= hi] + [m for m in markers if m.lane]
    xs = [p.x for p in points] + marks
    if lo <= min(xs) and hi >= max(xs):  # the window holds everything: nothing to zoom
        return None
    if not inside or max(xs) / max(1.0, min(xs)) < 4 * hi / lo:
        return None
    return (lo, hi)


def _limit_sentence(r: dict, predicted: dict | None = None) -> str:
    from dsv4bench.measure import hardware

    thr = hardware.SGLANG_DSV4_THRESHOLD
    route = f", {param(r, 'route')}" if r.get("op") == "prefill" else ""
    who = f"{r.get('backend')} ({param(r, 'model')}{route}, {r.get('axis')})"
    ok, fail = r.get("last_ok"), r.get("first_fail")
    if fail is None and ok is None:  # nothing to search: the backend could not run it
        return f"{who}: not searched ({r['status']}: {short(r.get('message'), 120)})."
    if fail is None:
        return f"{who}: no failure up to {ok}."
    if ok is None:
        return f"{who}: fails already at the lowest probe {fail} ({r['status']})."
    text = f"{who}: last ok **{ok}**, first failure **{fail}** ({r['status']})"
    step = r.get("step") or 1
    if fail - ok > 1:
        text += f" (searched to a step of {step})"
    if _mixed(r):
        return text + "; one request of `s_q` = chunk tokens, not sglang's routing."
    if not (_decode_route(r) and r.get("axis") == "tokens"):
        return text + "."  # sglang's threshold is about decode-route chunks only
    if r.get("axis") == "tokens" and predicted and fail - ok == 1 and ok not in predicted:
        text += (
            f"; not the predicted {', '.join(map(str, sorted(predicted)))}: this build's "
            "scheduler needs a different amount of shared memory per request"
        )
    if fail <= thr:
        return (
            text + f"; sglang's threshold {thr} routes chunks of {fail}..{thr} tokens "
            f"({thr - fail + 1} sizes) to the decode kernel, where they fail."
        )
    return text + f"; at or above sglang's threshold {thr}: no chunk size it routes fails."
