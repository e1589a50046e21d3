"""The report's "which backend wins" section: per shape the fastest `ok` backend, its margin over
the runner-up, and every backend's time as a ratio to the shape's baseline against batch size
(decode) and chunk size (prefill): FlashMLA's for attention, the project's Triton kernel's for the
DSA path's helper ops (HELPER_OPS: the engines' own helper kernels beside the project's Triton
versions, issue 46).

A shape is one case_id (the problem: op, model, heads, batch or chunk, s_q, ...) in one run:
a ratio never divides times of two runs, and a case measured in several runs has a line per
run. Only `ok` rows count: an incorrect or unsupported backend never wins, and the oracle
(`torch`) is a baseline, never a candidate. Backends are ranked by GPU time where every one of
a shape measured it (rows/timers.py): the profiler's kernel makespan (timer
`profiler`/`both`), else the CUDA-graph replay (`graph: true`), else the CUDA-events median.
Events sit a fixed ~2.8 us above the makespan below 50 us (launch and event overhead), so at
20-40 us they partly rank launch overheads; the events figure stays beside the GPU time.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dsv4bench.report import grouping, plots
from dsv4bench.report.doc import Doc
from dsv4bench.report.fmt import natural_text_key
from dsv4bench.rows import is_oracle_row, timers

BASELINE = "flashmla"
HELPER_BASELINE = "triton"  # the project's Triton version of a helper op
HELPER_OPS = ("cache_write", "dequant", "remap", "page_split", "topk")


def baseline_of(params: dict) -> str:
    """The backend a shape's ratios divide by: the project's Triton for a helper op."""
    return HELPER_BASELINE if params.get("op") in HELPER_OPS else BASELINE


@dataclass
class Shape:
    case_id: str
    params: dict
    times: dict[str, float] = field(default_factory=dict)  # backend -> ranked ms (ok rows)
    others: dict[str, str] = field(default_factory=dict)  # backend -> status, when not ok
    events: dict[str, float] = field(default_factory=dict)  # backend -> timed-call median ms
    basis: str = "events"  # what `times` holds (timers.PREFERENCE)
    timings: dict[str, dict] = field(default_factory=dict)  # backend -> its row's timing
    run: str = ""  # the run its rows come from

    def rank_by_gpu_time(self) -> None:
        """times := the first of timers.PREFERENCE that every ok backend of the shape measured."""
        rows = {b: {"timing": t} for b, t in self.timings.items()}
        found = timers.shared(list(rows.values()))
        if found:
            key, self.basis = found
            self.times = {b: timers.value(r, key) for b, r in rows.items()}

    @property
    def ranked(self) -> list[tuple[str, float]]:
        return sorted(self.times.items(), key=lambda kv: (kv[1], kv[0]))

    @property
    def winner(self) -> tuple[str, float] | None:
        return self.ranked[0] if self.times else None

    @property
    def margin(self) -> float | None:
        """Runner-up time / winner time (1.25 = the winner is 25% faster); None if alone."""
        r = self.ranked
        return r[1][1] / r[0][1] if len(r) > 1 and r[0][1] > 0 else None

    @property
    def baseline(self) -> str:
        return baseline_of(self.params)

    def ratio(self, backend: str) -> float | None:
        """backend time / the baseline's time (below 1: faster than the baseline)."""
        base = self.times.get(self.baseline)
        t = self.times.get(backend)
        return t / base if base and t else None


def shapes(rows: list[dict]) -> list[Shape]:
    """One Shape per run and case_id of the candidates' case rows with a time or a status."""
    by_id: dict[tuple[str, str], Shape] = {}
    for r in rows:
        if r.get("kind") != "case" or "limit-probe" in (r.get("tags") or []):
            continue
        backend = r.get("backend") or "?"
        if is_oracle_row(r):
            continue  # the oracle's rows are a baseline, never a candidate
        run = str(r.get("_run") or "")
        key = (run, r["case_id"])
        s = by_id.setdefault(key, Shape(r["case_id"], r.get("params") or {}, run=run))
        ms = timers.events_ms(r)
        if r.get("status") == "ok" and ms:
            s.events[backend] = s.times[backend] = ms
            s.timings[backend] = r["timing"]
            s.others.pop(backend, None)  # a rerun in one run: an ok row wins over another
        elif backend not in s.times:
            s.others[backend] = r.get("status") or "?"
    for s in by_id.values():
        s.rank_by_gpu_time()
    return [s for s in by_id.values() if len(s.times) + len(s.others) > 1]


def _size(p: dict) -> tuple[str, int]:
    """The x axis of a shape: ("batch", b) for decode, ("chunk", tokens) for prefill; the
    indexer's ragged form (a chunk of `tokens`) runs along its context."""
    if p.get("op") == "prefill":
        return "chunk", int(p.get("tokens") or 0)
    if p.get("op") == "indexer" and p.get("tokens"):
        return "context", int(p.get("context_len") or 0)
    return "batch", int(p.get("batch_size") or 0)


def _family(p: dict) -> str:
    """A curve's name: everything but the size."""
    if p.get("op") == "indexer":  # paged at one context per curve, ragged at one chunk
        form = f"t{p['tokens']}" if p.get("tokens") else f"ctx {p.get('context_len')}"
        extra = f" s_q {p['s_q']}" if p.get("s_q", 1) > 1 else ""
        return f"indexer {p.get('model')} h{p.get('num_heads')} {form}{extra}"
    extra = f" s_q {p['s_q']}" if p.get("op") == "decode" and p.get("s_q", 1) > 1 else ""
    route = f" {p['route']}" if p.get("op") == "prefill" and p.get("route") else ""
    return f"{p.get('op')} {p.get('model')} h{p.get('num_heads')}{extra}{route}"


def _order(s: Shape):
    p = s.params
    heads = -int(p.get("num_heads") or 0)
    return (p.get("op", ""), str(p.get("model")), heads, _family(p), _size(p))


def _labels(items: list[Shape]) -> dict[tuple[str, str], str]:
    """(run, case_id) -> the table's shape label: its family, plus the params that tell it
    apart from other shapes of the same family and size (a context length, a compress ratio),
    plus its run in brackets when the shapes come from several runs."""
    groups: dict[tuple, list[Shape]] = defaultdict(list)
    for s in items:
        groups[(_family(s.params), _size(s.params))].append(s)
    runs = len({s.run for s in items}) > 1
    labels = {}
    for (fam, _), members in groups.items():
        keys = sorted({k for m in members for k in m.params} - {"seed"})
        differ = [k for k in keys if len({json.dumps(m.params.get(k)) for m in members}) > 1]
        for m in members:
            extra = ", ".join(f"{k} {m.params.get(k)}" for k in differ)
            label = f"{fam} ({extra})" if extra else fam
            labels[(m.run, m.case_id)] = f"{label} [{m.run}]" if runs else label
    return labels


def table_rows(items: list[Shape]) -> list[list]:
    out = []
    labels = _labels(items)
    for s in sorted(items, key=_order):
        kind, size = _size(s.params)
        win = s.winner
        ranked = s.ranked
        runner = ranked[1] if len(ranked) > 1 else None
        ratios = {b: s.ratio(b) for b in s.times if b != s.baseline}
        out.append(
            [
                labels[(s.run, s.case_id)],
                f"{kind} {size}",
                win[0] if win else "none ok",
                f"{win[1]:.4g}" if win else "",
                s.basis if win else "",
                f"{s.events[win[0]]:.4g}" if win else "",
                f"{runner[0]} {runner[1]:.4g}" if runner else "",
                f"{s.margin:.2f}x" if s.margin else "",
                ", ".join(f"{b} {r:.2f}" for b, r in sorted(ratios.items()) if r),
                s.baseline if s.times.get(s.baseline) else "",
                ", ".join(f"{b}: {st}" for b, st in sorted(s.others.items())),
            ]
        )
    return out


def _variant(s: Shape) -> tuple:
    """What tells shapes of one family apart besides their size (context, top-k, page ...,
    and the run: a line never joins two runs)."""
    p = s.params
    size = {"chunk": "tokens", "context": "context_len"}.get(_size(p)[0], "batch_size")
    found = sorted((k, json.dumps(v)) for k, v in p.items() if k not in (size, "seed"))
    return tuple(found + ([("run", json.dumps(s.run))] if s.run else []))


def figure(items: list[Shape], path: Path) -> tuple[Path | None, int]:
    """Ratio to FlashMLA against batch/chunk size, one panel per curve family and one line per
    backend and family variant (a context, a page size), so that no line joins two problems.
    Returns (the PNG or None, how many families were measured at a single size only: those
    are in the table, not drawn, unless no family has a curve)."""
    families: dict[str, list[Shape]] = defaultdict(list)
    for s in items:
        if s.times.get(s.baseline) and len(s.times) > 1:
            families[_family(s.params)].append(s)
    curves = {f: v for f, v in families.items() if _has_curve(v)}
    if not families:
        return None, 0
    drawn = curves or families
    backends = sorted({b for v in drawn.values() for s in v for b in s.times if b != s.baseline})
    colors = plots.colors_for(backends)
    panels = [_panel(fam, members, colors) for fam, members in sorted(drawn.items())]
    title = "Time relative to FlashMLA (helper ops: to the project's Triton; below 1: faster)"
    fig = plots.line_figure(title, panels)
    return plots.save(fig, path), len(families) - len(drawn)


def _has_curve(members: list[Shape]) -> bool:
    sizes: dict[tuple, set] = defaultdict(set)
    for s in members:
        sizes[_variant(s)].add(_size(s.params)[1])
    return any(len(v) > 1 for v in sizes.values())


def _panel(fam: str, members: list[Shape], colors: dict | None = None) -> plots.Panel:
    groups: dict[tuple, list[Shape]] = defaultdict(list)
    for s in members:
        for b in s.times:
            if b != s.baseline and s.ratio(b):
                groups[(b, _variant(s))].append(s)
    curves = {g: v for g, v in groups.items() if len({_size(s.params) for s in v}) > 1}
    groups = curves or groups  # variants at one size only: in the table
    labels = grouping.line_variants(groups)
    variants = sorted({labels[g][0] for g in groups}, key=natural_text_key)
    series = []
    for g in sorted(groups, key=lambda g: (g[0], variants.index(labels[g][0]))):
        b, short = g[0], labels[g][1]
        i = variants.index(labels[g][0])
        pts = sorted((_size(s.params)[1], s.ratio(b)) for s in groups[g])
        series.append(
            plots.Series(
                f"{b} {short}" if short else b,
                [x for x, _ in pts],
                [y for _, y in pts],
                color=(colors or {}).get(b),
                marker=plots.MARKERS[i % len(plots.MARKERS)],
                linestyle=plots.LINESTYLES[i % len(plots.LINESTYLES)],
            )
        )
    kind = _size(members[0].params)[0]
    base = {BASELINE: "FlashMLA", HELPER_BASELINE: "Triton"}[members[0].baseline]
    return plots.Panel(
        fam,
        {"batch": "batch size", "chunk": "chunk tokens"}.get(kind, "context tokens"),
        f"time / {base} time",
        series,
        logx=True,
        hlines=[(1.0, f"{base} (= 1)", "black")],
    )


def add_section(doc: Doc, rows: list[dict], out_dir: Path) -> list[Path]:
    """Append the section to doc; returns the images written (none without a comparison)."""
    items = shapes(rows)
    if not items:
        return []
    runs = {s.run for s in items}
    doc.heading("Which backend wins")
    wins = defaultdict(int)
    for s in items:
        if s.winner:
            wins[s.winner[0]] += 1
    bases = defaultdict(int)
    for s in items:
        bases[s.basis] += 1
    doc.para(
        f"{len(items)} shapes run on more than one backend. Fastest `ok` backend per shape, by "
        "GPU time where every backend of the shape measured it ("
        + ", ".join(f"{n} by {b}" for b, n in sorted(bases.items(), key=lambda kv: -kv[1]))
        + "): "
        + ", ".join(f"{b} {n}" for b, n in sorted(wins.items(), key=lambda kv: -kv[1]))
        + ". Events add ~3 us of launch overhead below 50 us, so they are shown beside, not "
        "ranked by. Margin = runner-up time / winner time; ratios are backend time / the "
        "baseline's time (FlashMLA; for the helper ops cache_write, dequant, remap, page_split "
        "and topk the project's Triton kernel, so the engines' own helpers stand beside it), "
        "both in the ranked figure and of one run. The oracle (`torch`) is a baseline, "
        "not a candidate."
        + (
            f" Rows of {len(runs)} runs: a shape measured in several has a line per run "
            "(its run in brackets); no ratio divides times of two runs."
            if len(runs) > 1
            else ""
        )
    )
    doc.table(
        [
            "shape",
            "size",
            "winner",
            "ms",
            "ranked by",
            "events ms",
            "runner-up ms",
            "margin",
            "time / baseline time",
            "baseline",
            "not ok",
        ],
        table_rows(items),
    )
    png, single = figure(items, out_dir / "winners-ratio.png")
    if png is None:
        return []
    doc.image(png, "time relative to FlashMLA (helper ops: Triton) against batch and chunk size")
    if single:
        what = "shape family ... is" if single == 1 else "shape families ... are"
        noun, verb = what.split(" ... ")
        doc.para(f"{single} {noun} measured at a single size {verb} in the table, not drawn.")
    return [png]


def markdown(rows: list[dict], out_dir: Path) -> tuple[str, list[Path]]:
    """The section alone: its markdown and figure files."""
    doc = Doc("Backends compared")
    images = add_section(doc, rows, out_dir)
    return doc.to_markdown(), images
