"""Workloads (issue 23): time against the measured locality of the top-k indices, ragged
batches against uniform ones of the same total tokens, and the long-context curve.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.report import plots
from dsv4bench.report.fmt import code_span, fmt_num, kilo, make_slug, sci
from dsv4bench.report.load import case_rows, param, timed_attention_rows
from dsv4bench.rows import timers

LONG = 256 * 1024  # contexts from here on are the long-context curve


def workloads(rep) -> None:
    rows = timed_attention_rows(rep.rows)
    patterned = [r for r in rows if param(r, "index_pattern")]
    ragged = [r for r in case_rows(rep.rows) if param(r, "context_lens")]
    long = [r for r in rows if (param(r, "context_len") or 0) >= LONG and not param(r, "ragged")]
    steps = [r for r in rep.rows if r.get("kind") == "serving" and is_ragged_step(r)]
    if not (patterned or ragged or long or steps):
        rep.left_out.append(
            "Workloads: no rows with an index pattern, a ragged batch or a context >= 256K."
        )
        return
    rep.doc.heading("Workloads: locality, ragged batches, long context")
    if patterned:
        _locality(rep, rows)
    if ragged:
        _ragged(rep, ragged, rows)
    if steps:
        _ragged_tpot(rep, steps)
    if long:
        _long_context(rep, long)


def is_ragged_step(row: dict) -> bool:
    """A serving TPOT point over a ragged batch (serving/planning.py names its curve so)."""
    return "-ragged" in (row.get("curve_id") or "")


def drawn_set(row: dict) -> str:
    """The index set a pattern draws: V4's C4 top-k (extra_indices), else the main top-k."""
    return "extra_indices" if param(row, "compress_ratio") == 4 else "indices"


def pages_per_row(row: dict) -> float | None:
    loc = ((row.get("info") or {}).get("locality") or {}).get(drawn_set(row)) or {}
    return loc.get("pages_per_row")


def _shape(row: dict) -> str:
    ratio = param(row, "compress_ratio")
    layer = f" C{ratio}" if ratio else ""
    return f"{row.get('op')} {param(row, 'model')}{layer} b{param(row, 'batch_size')}"


def _locality(rep, rows: list[dict]) -> None:
    """One panel per shape: x the measured pages per row, y the time, a line per backend."""
    d = rep.doc
    d.heading("Time against index locality", 3)
    d.para(
        "Top-k sets drawn uniform, recent-biased, clustered, sorted, or by the suite's own "
        "indexer over keys with a recency or topic signal (cases/patterns.py). x is the "
        "locality measured on the indices the kernel read: distinct cache pages per query row "
        "(fewer = more local); `adjacent` is the share of picks whose neighbouring slot is "
        "also picked. y and `ms`: each row's GPU time by the winners' timer (column `timer`), "
        "the events median beside it."
    )
    base = [r for r in rows if not param(r, "context_lens")]
    shapes: dict[tuple, list[dict]] = {}
    for r in base:
        key = (r.get("op"), param(r, "model"), param(r, "compress_ratio"), param(r, "batch_size"))
        key += (param(r, "context_len"), param(r, "s_q"))
        shapes.setdefault(key, []).append(r)
    shapes = {k: v for k, v in shapes.items() if len({param(r, "index_pattern") for r in v}) > 1}
    panels, table = [], []
    for rs in shapes.values():
        series = []
        for backend in sorted({rep.who(r) for r in rs}):
            mine = sorted(
                (r for r in rs if rep.who(r) == backend and pages_per_row(r)),
                key=pages_per_row,
            )
            xs = [pages_per_row(r) for r in mine]
            series.append(plots.Series(backend, xs, [timers.ms(r) for r in mine]))
            for r in mine:
                loc = r["info"]["locality"][drawn_set(r)]
                pattern = param(r, "index_pattern") or "uniform"
                row = [_shape(r), kilo(param(r, "context_len")), pattern, backend]
                row += [fmt_num(loc["pages_per_row"]), fmt_num(loc["adjacent"])]
                table.append([*row, *_times(r)])
        title = f"{_shape(rs[0])} {kilo(param(rs[0], 'context_len'))}"
        panels.append(plots.Panel(title, "pages per query row", "GPU ms", series, logx=True))
    if not panels:
        d.para("No shape was measured under more than one index pattern.")
        return
    fig = plots.line_figure("Time against index locality", panels, max_cols=2)
    d.image(rep.save(fig, make_slug("workloads", "locality")), "time against locality")
    head = ["shape", "context", "pattern", "backend", "pages/row", "adjacent", *TIMES]
    d.table(head, table, caption="Index patterns: measured locality and time")


TIMES = ["ms", "timer", "events ms"]


def _times(row: dict) -> list[str]:
    """A row's time by its winners' timer, that timer's name and the events median beside."""
    found = timers.gpu_ms(row)
    if not found:
        return ["", "", ""]
    return [fmt_num(found[0]), found[1], fmt_num(timers.events_ms(row))]


def _twin(row: dict, uniform: list[dict]) -> dict | None:
    """The uniform row of the same shape and total tokens on the same backend, of the same run
    (a ratio never divides times of two runs)."""
    total = sum(param(row, "context_lens"))
    for u in uniform:
        same = all(
            param(u, k) == param(row, k)
            for k in ("op", "model", "compress_ratio", "s_q", "batch_size", "tokens")
        )
        same = same and (u.get("backend"), u.get("_run")) == (row.get("backend"), row.get("_run"))
        if same and param(u, "batch_size") * param(u, "context_len") == total:
            return u
    return None


def ragged_against_uniform(row: dict, uniform: list[dict]):
    """(twin, (timer key, name), ragged ms, uniform ms) of a ragged row: its uniform twin (or
    None) and both times by the first timer both measured; None where there is none."""
    twin = _twin(row, uniform) if row["status"] == "ok" else None
    timer = timers.shared([row, twin] if twin else [row])
    mine = timers.value(row, timer[0]) if timer else None
    theirs = timers.value(twin, timer[0]) if timer and twin else None
    return twin, timer, mine, theirs


def ragged_ratios(rows: list[dict]) -> list[tuple[dict, float]]:
    """(ragged row, ragged time / uniform time) for every ragged row with a uniform twin, as
    the section's table has them."""
    timed = timed_attention_rows(rows)
    uniform = [r for r in timed if not param(r, "context_lens")]
    out = []
    for r in case_rows(rows):
        if param(r, "context_lens"):
            _, _, mine, theirs = ragged_against_uniform(r, uniform)
            if mine and theirs:
                out.append((r, mine / theirs))
    return out


def _ragged(rep, ragged: list[dict], rows: list[dict]) -> None:
    d = rep.doc
    d.heading("Ragged batches", 3)
    d.para(
        "Each request its own context (`context_lens`); a decode batch is set beside the "
        "uniform batch of the same requests and total tokens, of the same run and backend: "
        "`ragged / uniform` is ragged time / uniform time (above 1: the ragged batch is "
        "slower), by the first timer both rows measured (column `timer`), the events ratio "
        "beside it. Ragged prefill is sglang's NSA path: one chunk per request over one "
        "concatenated workspace, request-relative indices offset by cu_seqlens_k; its oracle "
        "attends per request without the offsets."
    )
    uniform = [r for r in rows if not param(r, "context_lens")]
    table = []
    for r in ragged:
        lens = param(r, "context_lens")
        twin, timer, mine, theirs = ragged_against_uniform(r, uniform)
        ev, ev_twin = timers.events_ms(r), timers.events_ms(twin)
        table.append(
            [
                _shape(r),
                param(r, "ragged"),
                f"{kilo(min(lens))}..{kilo(max(lens))} (sum {kilo(sum(lens))})",
                rep.who(r),
                r["status"],
                sci((r.get("accuracy") or {}).get("cos_diff")),
                fmt_num(mine) if mine is not None else "",
                fmt_num(theirs) if theirs is not None else "",
                timer[1] if timer and mine is not None else "",
                f"{mine / theirs:.2f}" if mine and theirs else "",
                f"{ev / ev_twin:.2f}" if ev and ev_twin else "",
            ]
        )
    head = ["shape", "lengths", "min..max", "backend", "status", "cos_diff", "ms"]
    head += ["uniform ms", "timer", "ragged / uniform", "events ragged / uniform"]
    d.table(head, table, caption="Ragged batches against uniform ones of equal total tokens")


def _long_context(rep, long: list[dict]) -> None:
    d = rep.doc
    d.heading("Long context", 3)
    d.para(
        "V4 C4 and C128 layers from 256K tokens: GPU time per call (the winners' timer, "
        "column `timer`; the events median beside) and its GPU memory: the "
        "inputs, the peak while the backend prepared and ran it once (info.memory: conversions "
        "such as FlashInfer's bf16 pool included), and the timed call's own scratch above what "
        "it keeps (timing.memory)."
    )
    panels, table = [], []
    groups: dict[tuple, list[dict]] = {}
    for r in long:
        groups.setdefault((r.get("op"), param(r, "model")), []).append(r)
    for (op, model), rs in sorted(groups.items()):
        series = []
        for who in sorted({(rep.who(r), param(r, "compress_ratio")) for r in rs}):
            mine = sorted(
                (r for r in rs if (rep.who(r), param(r, "compress_ratio")) == who),
                key=lambda r: param(r, "context_len"),
            )
            xs = [param(r, "context_len") for r in mine]
            label = f"{who[0]} C{who[1]}"
            series.append(plots.Series(label, xs, [timers.ms(r) for r in mine]))
            for r in mine:
                mem = (r.get("info") or {}).get("memory") or {}
                scratch = ((r.get("timing") or {}).get("memory") or {}).get("scratch_bytes")
                row = [code_span(r["case_id"]), label, kilo(param(r, "context_len")), *_times(r)]
                row += [mem.get("inputs_mib", ""), mem.get("peak_mib", "")]
                row.append(fmt_num(scratch / 2**20) if isinstance(scratch, int) else "")
                table.append(row)
        panels.append(plots.Panel(f"{op} {model}", "context tokens", "GPU ms", series))
    fig = plots.line_figure("Long context", panels, max_cols=2)
    d.image(rep.save(fig, make_slug("workloads", "long-context")), "long context")
    head = ["case_id", "series", "context", *TIMES, "inputs MiB", "peak MiB", "scratch MiB"]
    d.table(head, table, caption="Long-context rows")


def _ragged_tpot(rep, steps: list[dict]) -> None:
    """Serving TPOT of a decode step over a ragged batch beside the uniform step of the same
    batch and total tokens (the serving file's `ragged` and `contexts`)."""
    cases = {r["case_id"]: r for r in case_rows(rep.rows)}
    uniform = [
        r
        for r in rep.rows
        if r.get("kind") == "serving"
        and r.get("metric") == "tpot"
        and "-ragged" not in r["curve_id"]
    ]
    table = []
    for r in steps:
        lens = next(
            (
                param(cases[p["case_id"]], "context_lens")
                for p in r["parts"]
                if p["case_id"] in cases
            ),
            None,
        )
        if not lens:
            continue
        label = param(cases[r["parts"][0]["case_id"]], "ragged")
        twin = next(
            (
                u
                for u in uniform
                if (u["model"], u["backend"], u["batch_size"], u.get("_run"))
                == (r["model"], r["backend"], len(lens), r.get("_run"))
                and u["batch_size"] * u["context_len"] == sum(lens)
            ),
            None,
        )
        mine, theirs = r.get("value_ms"), (twin or {}).get("value_ms")
        same = twin is not None and timers.point_timer(twin) == timers.point_timer(r)
        ev_mine, ev_theirs = timers.point_events_ms(r), timers.point_events_ms(twin or {})
        table.append(
            [
                r["model"],
                label,
                f"{kilo(min(lens))}..{kilo(max(lens))} (sum {kilo(sum(lens))})",
                r["backend"],
                fmt_num(mine) if mine is not None else r.get("status"),
                fmt_num(theirs) if theirs is not None else "",
                timers.point_timer(r) if same or twin is None else "differ",
                f"{mine / theirs:.2f}" if mine and theirs and same else "",
                f"{ev_mine / ev_theirs:.2f}" if ev_mine and ev_theirs else "",
            ]
        )
    if not table:
        return
    d = rep.doc
    d.heading("TPOT over ragged batches", 3)
    d.para(
        "One decode step of every layer (serving model: per-layer-kind attention medians times "
        "the layer counts) over a ragged batch, beside the uniform batch of the same requests "
        "and total tokens, of the same run: ragged / uniform is ragged TPOT / uniform TPOT "
        "(above 1: the ragged batch is slower). A TPOT sums its parts by the timer named "
        "(the run's, by the winners' rule; events where a part has no other), the ratio only "
        "where both points share it (`differ`: they do not); the events sums' ratio beside."
    )
    head = ["model", "lengths", "min..max", "backend", "TPOT ms", "uniform TPOT ms", "timer"]
    head += ["ragged / uniform", "events ragged / uniform"]
    d.table(head, table, caption="TPOT: ragged against uniform batches")
