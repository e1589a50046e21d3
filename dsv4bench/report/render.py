"""report.md + report.html (+ PNGs) from the rows of one or more runs.

Sections, each left out (with one line saying so) when the runs hold no rows for it:
serving TPOT and TTFT, kernel throughput, accuracy, crash boundary, head-padding overhead,
environment, failures.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

from dsv4bench.report import indexer_share, plots, winners
from dsv4bench.report.doc import Doc
from dsv4bench.report.load import (
    accuracy_failure,
    case_rows,
    family,
    is_probe,
    load_runs,
    median_ms,
    param,
    run_labels,
    short,
    tolerance,
)

FAILURE_ORDER = ("incorrect", "crash", "oom", "timeout", "error", "unsupported")
THRESHOLD_COLORS = {"sglang": "#9467bd", "predicted": "#ff7f0e"}


def build_report(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Write report.md, report.html and their PNGs into out_dir; returns the written files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = load_runs([Path(p) for p in run_dirs])
    report = Report(rows, out_dir, [Path(p) for p in run_dirs])
    doc = report.build()
    md = out_dir / "report.md"
    md.write_text(doc.to_markdown())
    page = out_dir / "report.html"
    page.write_text(doc.to_html())
    return [md, page, *report.images]


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _natural(v):
    """Sort key that orders numbers numerically and puts them before text."""
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def _natural_text(text: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def _slug(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(str(p) for p in parts if p)).strip("-").lower()


def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{digits}g}"
    return str(v)


def _k(n) -> str:
    """8192 -> 8K, 65536 -> 64K; other values as they are."""
    if isinstance(n, int) and not isinstance(n, bool) and n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def _route_order(route: str):
    """sparse-prefill, decode-kernel, threshold:N (by N), safe, then anything else."""
    fixed = {"sparse-prefill": 0, "decode-kernel": 1, "safe": 3}
    if route in fixed:
        return (fixed[route], _natural_text(route))
    return (2 if route.startswith("threshold:") else 4, _natural_text(route))


SHORT_ORDER = (
    "op",
    "layout",
    "route",
    "compress_ratio",
    "context_len",
    "extra_topk",
    "topk",
    "window",
    "s_q",
    "batch_size",
    "tokens",
    "num_heads",
)
DERIVED_PARAMS = ("extra_topk", "topk")  # follow from context length and compress ratio


def _short_param(name: str, v, params: dict) -> str:
    """A family param as a short plot label ("C4", "ctx 8K", "b64"); name=value otherwise."""
    if name == "compress_ratio":
        return f"C{v}" if v else ("SWA" if params.get("window") else "no extra cache")
    if name == "context_len":
        return f"ctx {_k(v)}"
    if name == "batch_size":
        return f"b{v}"
    if name == "tokens":
        return f"{_k(v)} tokens" if v else ""
    if name == "num_heads":
        return f"{v} heads"
    if name in ("op", "route", "layout", "model"):
        return str(v)
    if name in ("extra_topk", "topk", "window"):
        return f"{name.replace('_', ' ')} {v}"
    return f"{name}={v}"


def _sci(v) -> str:
    return f"{v:.2e}" if isinstance(v, (int, float)) else ""


def _pct(v) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else ""


def _code(text) -> str:
    return f"`{text}`" if text else ""


class Report:
    def __init__(self, rows: list[dict], out_dir: Path, paths: list[Path]):
        self.rows = rows
        self.out_dir = out_dir
        self.paths = paths
        self.images: list[Path] = []
        self.runs = run_labels(paths)
        self.multi_run = len({p.resolve() for p in paths}) > 1
        self.left_out: list[str] = []
        self.doc = Doc("dsv4bench report")

    # ---- helpers ----------------------------------------------------------------------------

    def who(self, row: dict) -> str:
        """Backend name, with the run when several runs are shown together."""
        b = row.get("backend") or "?"
        return f"{b} [{row['_run']}]" if self.multi_run else b

    def save(self, fig, name: str) -> Path:
        path = self.out_dir / f"{name}.png"
        plots.save(fig, path)
        self.images.append(path)
        return path

    # ---- document ---------------------------------------------------------------------------

    def build(self) -> Doc:
        body = Doc(self.doc.title)
        self.doc = body
        self.serving()
        self.kernels()
        self.images += winners.add_section(self.doc, self.rows, self.out_dir)
        self.accuracy()
        self.crash_boundary()
        self.head_padding()
        self.environment()
        self.failures()
        sections = body.blocks
        intro = Doc(body.title)
        self.doc = intro
        self.intro()
        intro.blocks += sections
        return intro

    def intro(self) -> None:
        d = self.doc
        kinds_by_run = {
            run: Counter(r["kind"] for r in self.rows if r["_run"] == run) for run in self.runs
        }
        d.table(
            ["run", "path", "case rows", "limit rows", "serving rows"],
            [
                [run, _code(str(path)), c.get("case", 0), c.get("limit", 0), c.get("serving", 0)]
                for (run, c), path in zip(kinds_by_run.items(), self.paths, strict=True)
            ],
        )
        cases = case_rows(self.rows)
        if not self.rows:
            d.para("These runs hold no rows yet.")
        if cases:
            statuses = [s for s in plots.STATUS_ORDER if any(r["status"] == s for r in cases)]
            per = defaultdict(Counter)
            for r in cases:
                per[self.who(r)][r["status"]] += 1
            d.para("Rows per backend and status (limit probes included):")
            d.table(
                ["backend", *statuses, "total"],
                [
                    [b, *[c.get(s, 0) or "" for s in statuses], sum(c.values())]
                    for b, c in sorted(per.items())
                ],
            )
        if self.left_out:
            d.para("Left out for lack of data:")
            d.bullets(self.left_out)

    # ---- serving ----------------------------------------------------------------------------

    def serving(self) -> None:
        serving = [r for r in self.rows if r["kind"] == "serving"]
        tpot = [r for r in serving if r.get("metric") == "tpot"]
        ttft = [r for r in serving if r.get("metric") == "ttft"]
        if tpot:
            self.tpot(tpot)
        else:
            self.left_out.append("TPOT curves: no serving rows with metric `tpot`.")
        if ttft:
            self.ttft(ttft)
        else:
            self.left_out.append("TTFT curves: no serving rows with metric `ttft`.")
        indexer_share.section(self, serving)

    def _label_line(self, rows: list[dict]) -> str:
        labels = sorted({r["label"] for r in rows if r.get("label")})
        return "; ".join(labels)

    def _parts_table(self, points: list[tuple[str, dict]], caption: str) -> None:
        self.doc.table(
            ["point", "case_id", "role", "row of", "multiplicity", "median ms", "status"],
            [
                [
                    pid,
                    _code(p.get("case_id")),
                    p.get("role") or "",
                    p.get("backend") or "",
                    p.get("multiplicity"),
                    _fmt(p.get("median_ms")),
                    p.get("status"),
                ]
                for pid, r in points
                for p in r["parts"]
            ],
            caption=caption,
            folded=True,
        )

    @staticmethod
    def _serving_figures(rows: list[dict]) -> list[tuple[str, str, list[dict]]]:
        """(title, file slug, rows) per model and heads per rank."""
        keys = sorted(
            {(str(r.get("model")), r.get("num_heads") or 0, r.get("tp") or 0) for r in rows},
            key=lambda k: (k[0], -k[1], k[2]),
        )
        several = len({k[0] for k in keys}) < len(keys)
        out = []
        for model, heads, tp in keys:
            title, slug = model, [model]
            if several or (tp and tp > 1):
                bits = [f"{heads} heads/rank" if heads else "", f"TP {tp}" if tp else ""]
                title += " (" + ", ".join(b for b in bits if b) + ")"
                slug += [f"h{heads}" if heads else "", f"tp{tp}" if tp else ""]
            sel = [
                r
                for r in rows
                if (str(r.get("model")), r.get("num_heads") or 0, r.get("tp") or 0)
                == (model, heads, tp)
            ]
            out.append((title, _slug(*slug), sel))
        return out

    def _serving_lines(self, rows: list[dict]) -> dict[int, str]:
        """Per row (by id), the name of its line: the backend, with the scenario where one
        backend's rows in this figure come from several scenarios."""
        scenarios = defaultdict(set)
        for r in rows:
            scenarios[self.who(r)].add(str(r.get("scenario") or ""))
        return {
            id(r): (
                f"{self.who(r)} ({r.get('scenario')})"
                if len(scenarios[self.who(r)]) > 1
                else self.who(r)
            )
            for r in rows
        }

    def _route_title(self, route: str, rows: list[dict]) -> str:
        """A route and what it means: the threshold's source, the measured limit behind safe."""
        from dsv4bench import hardware

        if route == "decode-kernel":
            return "decode-kernel (b = chunk tokens)"
        if route == "sparse-prefill":
            return "sparse-prefill (prefill kernel)"
        if route.startswith("threshold:"):
            n = route.split(":", 1)[1]
            if n == str(hardware.SGLANG_DSV4_THRESHOLD):
                return f"{route} (sglang DSv4)"
            return f"{route} (decode kernel up to {n} tokens)"
        if route == "safe":
            limits = {r.get("threshold") for r in rows if str(r.get("route")) == "safe"}
            limits = {v for v in limits if _is_num(v)}
            if not limits:
                models = {str(r.get("model")) for r in rows}
                limits = {
                    r["last_ok"]
                    for r in self.rows
                    if r["kind"] == "limit"
                    and _is_num(r.get("last_ok"))
                    and str(param(r, "model")) in models
                    and param(r, "route") in (None, "decode-kernel")
                }
            if limits:
                return "safe (measured limit " + "/".join(str(v) for v in sorted(limits)) + ")"
            return "safe (threshold = measured limit)"
        return route

    @staticmethod
    def _point_id(r: dict, i: int, prefix: str) -> str:
        return r.get("case_id") or f"{prefix}{i}"

    @staticmethod
    def _breakdown(r: dict) -> str:
        b = r.get("breakdown_ms")
        if not isinstance(b, dict):
            return ""
        return " / ".join(f"{k} {_fmt(v)}" for k, v in b.items() if v)

    def tpot(self, rows: list[dict]) -> None:
        d = self.doc
        d.heading("Serving: TPOT (decode step, attention part)")
        label = self._label_line(rows)
        if label:
            d.para(
                f"What the numbers count: {label}. Color: context length; where several "
                "backends (or scenarios) are shown, line style and marker tell them apart and "
                "the y axis is logarithmic."
            )
        for title, slug, mrows in self._serving_figures(rows):
            line_of = self._serving_lines(mrows)
            lines = sorted(set(line_of.values()), key=_natural_text)
            ctxs = sorted({r.get("context_len") or 0 for r in mrows})
            ctx_color = {c: plots.PALETTE[i % len(plots.PALETTE)] for i, c in enumerate(ctxs)}
            styled = len(lines) > 1
            series = []
            for li, line in enumerate(lines):
                brows = [r for r in mrows if line_of[id(r)] == line]
                for ctx in ctxs:
                    pts = sorted(
                        (r for r in brows if (r.get("context_len") or 0) == ctx),
                        key=lambda r: r.get("batch_size") or 0,
                    )
                    if not pts:
                        continue
                    series.append(
                        _serving_series(
                            pts,
                            "batch_size",
                            label=f"{line}, context {_k(ctx)}",
                            color=ctx_color[ctx],
                            linestyle=plots.LINESTYLES[li % len(plots.LINESTYLES)],
                            marker=plots.MARKERS[li % len(plots.MARKERS)],
                        )
                    )
            legend = {
                f"context {_k(c)}": {"color": ctx_color[c], "marker": "o", "ms": 4.5} for c in ctxs
            }
            if styled:  # backends as line style and marker, in black
                legend.update(
                    {
                        line: {
                            "color": "0.25",
                            "linestyle": plots.LINESTYLES[i % len(plots.LINESTYLES)],
                            "marker": plots.MARKERS[i % len(plots.MARKERS)],
                            "ms": 4.5,
                        }
                        for i, line in enumerate(lines)
                    }
                )
            panel = plots.Panel(
                " vs ".join(lines) if styled else lines[0] if lines else "",
                "batch size (requests)",
                "TPOT attention part (ms)" + (", log" if styled else ""),
                series,
                logy=True if styled else None,
            )
            fig = plots.line_figure(
                f"TPOT vs batch size: {title}", [panel], panel_w=plots.PANEL_W * 1.35, legend=legend
            )
            d.heading(f"TPOT: {title}", 3)
            d.image(self.save(fig, _slug("tpot", slug)), f"TPOT vs batch size, {title}")
            ordered = sorted(
                mrows,
                key=lambda r: (
                    _natural_text(line_of[id(r)]),
                    r.get("context_len") or 0,
                    r.get("batch_size") or 0,
                ),
            )
            points = [(self._point_id(r, i, "P"), r) for i, r in enumerate(ordered, 1)]
            failed = [(pid, r) for pid, r in points if r.get("value_ms") is None]
            if failed:
                d.table(
                    ["point", "backend", "context", "batch", "status", "message"],
                    [
                        [
                            _code(pid),
                            line_of[id(r)],
                            r.get("context_len"),
                            r.get("batch_size"),
                            r.get("status"),
                            short(r.get("message")),
                        ]
                        for pid, r in failed
                    ],
                    caption=f"Failed TPOT points (x marks), {title}",
                )
            d.table(
                [
                    "point",
                    "backend",
                    "context",
                    "batch",
                    "TPOT ms",
                    "breakdown ms",
                    "status",
                    "parts",
                ],
                [
                    [
                        _code(pid),
                        line_of[id(r)],
                        r.get("context_len"),
                        r.get("batch_size"),
                        _fmt(r.get("value_ms")),
                        self._breakdown(r),
                        r.get("status"),
                        len(r["parts"]),
                    ]
                    for pid, r in points
                ],
                caption=f"TPOT points, {title}",
            )
            self._parts_table(points, f"TPOT parts (kernel rows behind each point), {title}")

    def ttft(self, rows: list[dict]) -> None:
        d = self.doc
        d.heading("Serving: TTFT (prefill, attention part)")
        label = self._label_line(rows)
        if label:
            d.para(f"What the numbers count: {label}.")
        d.para(
            "One panel per route, y axis shared (log); color: chunk size, the same in every "
            "panel. A point whose part failed is an x at the panel's bottom edge and is listed "
            "below."
        )
        for title, slug, mrows in self._serving_figures(rows):
            chunks = sorted({r.get("chunk_size") or 0 for r in mrows})
            chunk_color = {c: plots.PALETTE[i % len(plots.PALETTE)] for i, c in enumerate(chunks)}
            routes = sorted({str(r.get("route")) for r in mrows}, key=_route_order)
            whos = sorted({self.who(r) for r in mrows})
            panels = []
            for who in whos:
                brows = [r for r in mrows if self.who(r) == who]
                for route in routes:
                    series = []
                    for ci, chunk in enumerate(chunks):
                        pts = sorted(
                            (
                                r
                                for r in brows
                                if str(r.get("route")) == route
                                and (r.get("chunk_size") or 0) == chunk
                            ),
                            key=lambda r: r.get("prompt_len") or 0,
                        )
                        if not pts:
                            continue
                        series.append(
                            _serving_series(
                                pts,
                                "prompt_len",
                                label=f"chunk {chunk}",
                                color=chunk_color[chunk],
                                marker=plots.MARKERS[ci % len(plots.MARKERS)],
                            )
                        )
                    route_title = self._route_title(route, mrows)
                    panels.append(
                        plots.Panel(
                            f"{who}: {route_title}" if len(whos) > 1 else route_title,
                            "prompt length (tokens)",
                            "TTFT attention part (ms, log)",
                            series,
                            logx=True,
                            logy=True,
                            note=f"no {route} rows for {who}",
                        )
                    )
            legend = {
                f"chunk {c}": {
                    "color": chunk_color[c],
                    "marker": plots.MARKERS[i % len(plots.MARKERS)],
                    "ms": 4.5,
                }
                for i, c in enumerate(chunks)
            }
            if len(whos) > 1:  # a row of panels per backend, a column per route
                layout = {"ncols": len(routes), "panel_w": plots.PANEL_W * 0.8}
            else:
                layout = {"ncols": 2 if len(routes) in (2, 4) else min(3, len(routes))}
            fig = plots.line_figure(
                f"TTFT vs prompt length: {title}", panels, sharey=True, legend=legend, **layout
            )
            d.heading(f"TTFT: {title}", 3)
            d.image(self.save(fig, _slug("ttft", slug)), f"TTFT vs prompt length, {title}")
            ordered = sorted(
                mrows,
                key=lambda r: (
                    self.who(r),
                    _route_order(str(r.get("route"))),
                    r.get("chunk_size") or 0,
                    r.get("prompt_len") or 0,
                ),
            )
            points = [(self._point_id(r, i, "F"), r) for i, r in enumerate(ordered, 1)]
            failed = [(pid, r) for pid, r in points if r.get("value_ms") is None]
            if failed:
                d.table(
                    ["point", "backend", "route", "chunk", "prompt", "status", "message"],
                    [
                        [
                            _code(pid),
                            self.who(r),
                            r.get("route"),
                            r.get("chunk_size"),
                            r.get("prompt_len"),
                            r.get("status"),
                            short(r.get("message")),
                        ]
                        for pid, r in failed
                    ],
                    caption=f"Failed TTFT points (x marks), {title}",
                )
            d.table(
                [
                    "point",
                    "backend",
                    "route",
                    "chunk",
                    "prompt",
                    "TTFT ms",
                    "breakdown ms",
                    "status",
                    "parts",
                ],
                [
                    [
                        _code(pid),
                        self.who(r),
                        r.get("route"),
                        r.get("chunk_size"),
                        r.get("prompt_len"),
                        _fmt(r.get("value_ms")),
                        self._breakdown(r),
                        r.get("status"),
                        len(r["parts"]),
                    ]
                    for pid, r in points
                ],
                caption=f"TTFT points, {title}",
            )
            self._parts_table(points, f"TTFT parts (kernel rows behind each point), {title}")

    # ---- kernel throughput ------------------------------------------------------------------

    def _groups(self, rows: list[dict], skip: set[str]) -> dict[tuple, list[dict]]:
        """Rows grouped by (backend[, run], every param except `skip`): one line each."""
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for r in rows:
            key = tuple(
                sorted(
                    (k, json.dumps(v, sort_keys=True))
                    for k, v in (r.get("params") or {}).items()
                    if k not in skip
                )
            )
            groups[(self.who(r), key)].append(r)
        return dict(groups)

    @staticmethod
    def _variants(groups: dict[tuple, list[dict]]) -> dict[tuple, tuple[str, str]]:
        """Per group, the params that differ between the figure's families, in full
        ("compress_ratio=4, context_len=8192") and short ("C4 ctx 8K"); ("", "") if none.
        The short form leaves out params that follow from the others (extra_topk, topk) where
        the labels stay distinct, and is "" for every group when it would merge two."""
        keys = {key for (_, key) in groups}
        varying = sorted(
            (
                name
                for name in {k for key in keys for k, _ in key}
                if len({dict(key).get(name) for key in keys}) > 1
            ),
            key=lambda n: (SHORT_ORDER.index(n) if n in SHORT_ORDER else len(SHORT_ORDER), n),
        )
        values = {g: {k: json.loads(v) for k, v in g[1]} for g in groups}

        def full(g):
            kv = values[g]
            return ", ".join(f"{n}={kv.get(n, '-')}" for n in varying)

        def shorten(g, names):
            kv = values[g]
            bits = [_short_param(n, kv[n], kv) if n in kv else f"{n} -" for n in names]
            return " ".join(b for b in bits if b)

        def distinct(names):
            labels = [(g[0], shorten(g, names)) for g in groups]
            return len(set(labels)) == len(labels)

        names = list(varying)
        if not distinct(names):
            return {g: (full(g), "") for g in groups}
        for n in DERIVED_PARAMS:
            if n in names and distinct([m for m in names if m != n]):
                names.remove(n)
        return {g: (full(g), shorten(g, names)) for g in groups}

    def _styled(self, groups: dict[tuple, list[dict]]) -> list[tuple[tuple, str, dict, str]]:
        """(group, label, style, full label) in a natural order: color = backend, marker and
        line style = the family variant (the params that differ). The label is short
        ("flashmla C4 ctx 8K") where one can be derived, the full one names every param."""
        variants = self._variants(groups)

        def order(g):
            key = tuple((k, _natural(json.loads(v))) for k, v in g[1])
            return (g[0], key)

        whos = sorted({g[0] for g in groups})
        kinds = sorted({v[0] for v in variants.values()}, key=_natural_text)
        out = []
        for g in sorted(groups, key=order):
            var, short_var = variants[g]
            i = kinds.index(var)
            style = {
                "color": plots.PALETTE[whos.index(g[0]) % len(plots.PALETTE)],
                "marker": plots.MARKERS[i % len(plots.MARKERS)],
                "linestyle": plots.LINESTYLES[i % len(plots.LINESTYLES)],
            }
            full = ", ".join(b for b in (g[0], var) if b)
            label = " ".join(b for b in (g[0], short_var) if b) if short_var else full
            out.append((g, label, style, full))
        return out

    def kernels(self) -> None:
        rows = [
            r
            for r in case_rows(self.rows)
            if r["status"] == "ok"
            and not is_probe(r)
            and r.get("op") in ("decode", "prefill")
            and median_ms(r) is not None
            and (r.get("derived") or {}).get("tflops") is not None
        ]
        if not rows:
            self.left_out.append("Kernel throughput: no ok decode/prefill rows with TFLOP/s.")
            return
        d = self.doc
        d.heading("Kernel throughput")
        d.para(
            "TFLOP/s counts useful heads only (`2 * tokens * heads * topk * (d_qk + d_v)`, "
            "FlashMLA's count). Fraction of peak is the larger of compute/peak bf16 and "
            "bytes/peak bandwidth (the binding roof, column `bound`)."
        )
        for op, xkey, xlabel in (
            ("decode", "batch_size", "batch size (requests)"),
            ("prefill", "tokens", "chunk tokens"),
        ):
            orows = [r for r in rows if r["op"] == op]
            for model in sorted({str(param(r, "model")) for r in orows}):
                mrows = [r for r in orows if str(param(r, "model")) == model]
                # rows measured only as parts of serving points (tag `serving`) are a scatter
                # of shapes, one line each: drawn only when the model has nothing else
                serving = [r for r in mrows if "serving" in (r.get("tags") or [])]
                sweep = [r for r in mrows if "serving" not in (r.get("tags") or [])]
                plotted = [r for r in (sweep or mrows) if _is_num(param(r, xkey))]
                groups = self._groups(plotted, {xkey, "seed", "model"})
                lines = {g: rs for g, rs in groups.items() if len({param(r, xkey) for r in rs}) > 1}
                single = len(groups) - len(lines) if lines else 0
                tf_series, pk_series = [], []
                label_of: dict[int, tuple[str, str]] = {}
                for gkey, label, style, full in self._styled(lines or groups):
                    for r in groups[gkey]:
                        label_of[id(r)] = (label, full)
                    rs = sorted(groups[gkey], key=lambda r: param(r, xkey) or 0)
                    xs = [param(r, xkey) for r in rs]
                    tf_series.append(
                        plots.Series(label, xs, [r["derived"]["tflops"] for r in rs], **style)
                    )
                    pk = [(param(r, xkey), r["derived"].get("peak_fraction")) for r in rs]
                    pk = [(x, y) for x, y in pk if y is not None]
                    if pk:
                        pk_series.append(
                            plots.Series(label, [x for x, _ in pk], [y for _, y in pk], **style)
                        )
                panels = [
                    plots.Panel("achieved TFLOP/s", xlabel, "TFLOP/s (useful heads)", tf_series),
                    plots.Panel(
                        "fraction of peak (binding roof)",
                        xlabel,
                        "fraction of peak",
                        pk_series,
                        ypercent=True,
                        note="no peak known for this device (CPU run?)",
                        hlines=(
                            [(1.0, "100% of peak", "0.4")]
                            if any(y >= 1.0 for s in pk_series for y in s.ys)
                            else []
                        ),
                    ),
                ]
                fig = plots.line_figure(
                    f"{op} kernel throughput vs {xlabel}: {model}", panels, max_cols=2
                )
                d.heading(f"{op}: {model}", 3)
                d.image(self.save(fig, _slug("kernel", op, model)), f"{op} throughput {model}")
                if single:
                    d.para(
                        f"{single} families measured at a single {xkey} value are not drawn "
                        "as lines; their rows are in the table."
                    )
                if serving and sweep:
                    d.para(
                        f"{len(serving)} rows measured as parts of serving points (tag "
                        "`serving`, every layer shape of every point) are not drawn; they are "
                        "in the table and in the serving parts tables."
                    )
                table = []
                for r in sorted(
                    mrows,
                    key=lambda r: (
                        id(r) not in label_of,  # the drawn rows first, line by line
                        self.who(r),
                        _natural_text(label_of.get(id(r), ("", ""))[0]),
                        _natural(param(r, xkey)),
                        r["case_id"],
                    ),
                ):
                    der = r["derived"]
                    label, full = label_of.get(id(r), ("", ""))
                    table.append(
                        [
                            _code(r["case_id"]),
                            self.who(r),
                            label,
                            full,
                            param(r, xkey),
                            _fmt(median_ms(r)),
                            _fmt(der.get("tflops"), 4),
                            _fmt(der.get("gbps"), 4),
                            _pct(der.get("peak_fraction")),
                            der.get("bound") or "",
                        ]
                    )
                d.table(
                    [
                        "case_id",
                        "backend",
                        "line (plot label)",
                        "line params",
                        xkey,
                        "median ms",
                        "TFLOP/s",
                        "GB/s",
                        "peak",
                        "bound",
                    ],
                    table,
                    caption=f"{op} rows, {model}",
                )

    # ---- accuracy ---------------------------------------------------------------------------

    def accuracy(self) -> None:
        rows = [
            r
            for r in case_rows(self.rows)
            if isinstance((r.get("accuracy") or {}).get("cos_diff"), (int, float))
        ]
        if not rows:
            self.left_out.append("Accuracy: no rows with an accuracy measurement.")
            return
        d = self.doc
        d.heading("Accuracy against the oracle")
        d.para(
            "cos_diff = 1 - 2<a,b>/(|a|^2+|b|^2) against the fp32 PyTorch oracle, per case "
            "family (op/model/layout[/route]). Red dashes: tolerance (FlashMLA's tests: 5e-6 "
            "decode, 7e-6 prefill, unless the case carries its own); red rings: beyond it."
        )
        points_cos, points_lse = [], []
        tol_cos: dict[str, Counter] = defaultdict(Counter)
        tol_lse: dict[str, Counter] = defaultdict(Counter)
        for r in rows:
            acc = r["accuracy"]
            fam, who = family(r), self.who(r)
            tol = tolerance(r)
            tol_cos[fam][tol["cos_diff"]] += 1
            tol_lse[fam][tol["lse_abs"]] += 1
            cos, lse = float(acc["cos_diff"]), acc.get("lse_max_abs")
            lse_bad = isinstance(lse, (int, float)) and not lse <= tol["lse_abs"]
            # a ring on the metric that is beyond its tolerance; an `incorrect` row whose
            # lse is fine (non-finite values, a stricter case tolerance) rings its cos_diff
            cos_bad = not cos <= tol["cos_diff"] or (r["status"] == "incorrect" and not lse_bad)
            points_cos.append(plots.CatPoint(fam, who, cos, cos_bad))
            if isinstance(lse, (int, float)):
                points_lse.append(plots.CatPoint(fam, who, float(lse), lse_bad))
        panels = [("output: cosine difference", "cos_diff (log)", points_cos)]
        tols = [{f: c.most_common(1)[0][0] for f, c in tol_cos.items()}]
        if points_lse:
            panels.append(("log-sum-exp: max abs error", "lse max abs error (log)", points_lse))
            tols.append({f: c.most_common(1)[0][0] for f, c in tol_lse.items()})
        fig = plots.category_figure("Accuracy per case family and backend", panels, tols)
        d.image(self.save(fig, "accuracy"), "accuracy per case family")
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for r in rows:
            groups[(family(r), self.who(r))].append(r)
        table = []
        for (fam, who), rs in sorted(groups.items()):
            worst = max(rs, key=lambda r: r["accuracy"]["cos_diff"])
            lses = [r["accuracy"].get("lse_max_abs") for r in rs]
            lses = [x for x in lses if isinstance(x, (int, float))]
            beyond = sum(
                1 for r in rs if r["status"] == "incorrect" or accuracy_failure(r) is not None
            )
            table.append(
                [
                    fam,
                    who,
                    len(rs),
                    _sci(worst["accuracy"]["cos_diff"]),
                    _code(worst["case_id"]),
                    _sci(max(lses)) if lses else "",
                    _sci(tolerance(worst)["cos_diff"]),
                    beyond or "",
                ]
            )
        d.table(
            [
                "family",
                "backend",
                "cases",
                "worst cos_diff",
                "worst case",
                "max lse error",
                "tolerance",
                "beyond",
            ],
            table,
            caption="Worst case per family and backend",
        )

    # ---- crash boundary ---------------------------------------------------------------------

    def crash_boundary(self) -> None:
        from dsv4bench import hardware

        points: dict[tuple[str, float], tuple[str, str, str]] = {}
        for r in case_rows(self.rows):
            if r.get("op") == "prefill" and param(r, "route") == "decode-kernel":
                x = param(r, "tokens")
            elif r.get("op") == "decode" and is_probe(r):
                x = param(r, "batch_size")
            else:
                continue
            if isinstance(x, (int, float)):
                points[(self._lane(r), x)] = (r["status"], r["case_id"], short(r.get("message")))
        limits = [r for r in self.rows if r["kind"] == "limit"]
        for r in limits:
            for value, status in (r.get("probes") or {}).items():
                try:
                    x = int(value)
                except (TypeError, ValueError):
                    continue
                points.setdefault((self._lane(r), x), (status, r["case_id"], "limit probe"))
        if not points and not limits:
            self.left_out.append("Crash boundary: no decode-kernel route rows and no limit rows.")
            return
        d = self.doc
        d.heading("Crash boundary: decode-kernel route")
        d.para(
            "FlashMLA's decode scheduler needs `4*(5b+1)` bytes of shared memory for batch `b`; "
            "sglang's DSv4 path sends a prefill chunk to the decode kernel with `b` = chunk "
            f"tokens while `tokens <= {hardware.SGLANG_DSV4_THRESHOLD}`. Each point is one run "
            "in a fresh process; vertical lines are the engine threshold, the limit predicted "
            "from the GPU's per-block shared memory, and the measured limit per lane."
        )
        markers = [
            plots.Marker(
                hardware.SGLANG_DSV4_THRESHOLD,
                f"sglang DSv4 threshold {hardware.SGLANG_DSV4_THRESHOLD}",
                THRESHOLD_COLORS["sglang"],
            )
        ]
        predicted = self._predicted_limits()
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
            lane = self._lane(r)
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
                self._lane(r),
                r["first_fail"],
                hardware.SGLANG_DSV4_THRESHOLD,
                "fails, yet routed to the decode kernel by sglang",
                "#d62728",
            )
            for r in limits
            if r.get("first_fail") is not None and r["first_fail"] <= hardware.SGLANG_DSV4_THRESHOLD
        ]
        spts = [plots.StatusPoint(lane, x, st) for (lane, x), (st, _, _) in sorted(points.items())]
        zoom = self._zoom(spts, markers)
        axis_names = sorted({r.get("axis") or "tokens" for r in limits}) or ["tokens"]
        xlabel = (
            "chunk tokens = decode batch b"
            if axis_names == ["tokens"]
            else (" / ".join(axis_names) + " (decode batch b)")
        )
        fig = plots.status_figure(
            "Status vs size on the decode-kernel route", spts, markers, xlabel, zoom, spans
        )
        d.image(self.save(fig, "crash-boundary"), "crash boundary")
        if predicted:
            d.bullets(
                [
                    f"Predicted: `floor(({smem}/4 - 1)/5)` = **{limit}** ({where}); sglang's "
                    f"threshold {hardware.SGLANG_DSV4_THRESHOLD} "
                    + (
                        f"leaves {len(hardware.sglang_crash_batches(smem))} chunk sizes "
                        f"({limit + 1}..{hardware.SGLANG_DSV4_THRESHOLD}) that it routes to the "
                        "decode kernel and that cannot be scheduled."
                        if limit < hardware.SGLANG_DSV4_THRESHOLD
                        else "is within it."
                    )
                    for limit, (smem, where) in sorted(predicted.items())
                ]
            )
        if limits:
            d.bullets([self._limit_sentence(r) for r in limits])
            d.table(
                ["lane", "axis", "last ok", "first fail", "status", "message", "probes"],
                [
                    [
                        self._lane(r),
                        r.get("axis"),
                        r.get("last_ok"),
                        r.get("first_fail"),
                        r["status"],
                        short(r.get("message"), 120),
                        ", ".join(f"{k}:{v}" for k, v in (r.get("probes") or {}).items()),
                    ]
                    for r in limits
                ],
                caption="Measured limits (bisection, fresh process per probe)",
            )
        d.table(
            ["lane", "size", "status", "row", "message"],
            [
                [lane, x, st, _code(cid), msg]
                for (lane, x), (st, cid, msg) in sorted(points.items())
            ],
            caption="Every point in the plot",
            folded=True,
        )

    def _lane(self, r: dict) -> str:
        model = param(r, "model") or "?"
        return f"{self.who(r)} · {model}"

    def _predicted_limits(self) -> dict[int, tuple[int, str]]:
        """Scheduler limits predicted from the runs' per-block shared memory: the value the
        device reported (env smem_per_block_optin), else the GPU table's."""
        from dsv4bench import hardware

        found: dict[int, tuple[int, str]] = {}
        for r in self.rows:
            env = r.get("env") or {}
            smem, where = env.get("smem_per_block_optin"), env.get("gpu") or "device"
            if not smem and env.get("gpu"):
                spec = hardware.lookup(str(env["gpu"]))
                smem = spec.smem_per_block_optin if spec else None
                where = f"{env['gpu']}, from the GPU table"
            if isinstance(smem, int) and smem > 0:
                found.setdefault(hardware.flashmla_sched_batch_limit(smem), (smem, where))
        return found

    @staticmethod
    def _zoom(points, markers) -> tuple[float, float] | None:
        marks = [m.x for m in markers]
        lo, hi = min(marks), max(marks)
        pad = max(24.0, 0.25 * (hi - lo))
        lo, hi = lo - pad, hi + pad
        inside = [p for p in points if lo <= p.x <= hi] + [m for m in markers if m.lane]
        xs = [p.x for p in points] + marks
        if not inside or max(xs) / max(1.0, min(xs)) < 4 * hi / lo:
            return None
        return (lo, hi)

    @staticmethod
    def _limit_sentence(r: dict) -> str:
        from dsv4bench import hardware

        thr = hardware.SGLANG_DSV4_THRESHOLD
        who = f"{r.get('backend')} ({param(r, 'model')}, {r.get('axis')})"
        ok, fail = r.get("last_ok"), r.get("first_fail")
        if fail is None:
            return f"{who}: no failure up to {ok}."
        if ok is None:
            return f"{who}: fails already at the lowest probe {fail} ({r['status']})."
        text = f"{who}: last ok **{ok}**, first failure **{fail}** ({r['status']})"
        if fail <= thr:
            return (
                text + f"; sglang's threshold {thr} routes chunks of {fail}..{thr} tokens "
                f"({thr - fail + 1} sizes) to the decode kernel, where they fail."
            )
        return text + f"; at or above sglang's threshold {thr}: no chunk size it routes fails."

    # ---- head padding -----------------------------------------------------------------------

    def head_padding(self) -> None:
        rows = [
            r
            for r in case_rows(self.rows)
            if r["status"] == "ok"
            and not is_probe(r)
            and r.get("op") in ("decode", "prefill")
            and median_ms(r) is not None
            and isinstance(param(r, "num_heads"), int)
            and param(r, "num_heads") > 0
        ]
        groups = self._groups(rows, {"num_heads", "head_padding", "seed", "model"})
        groups = {k: v for k, v in groups.items() if len({param(r, "num_heads") for r in v}) > 1}
        if not groups:
            self.left_out.append(
                "Head-padding overhead: no case family measured at more than one head count."
            )
            return
        d = self.doc
        d.heading("Head-padding overhead")
        d.para(
            "Time per useful head = median time / useful heads per rank. Kernels pad heads "
            "(FP8 decode to 64 or 128), so below the padded count the time per useful head "
            "grows as heads shrink (tensor parallelism divides heads across ranks)."
        )
        models = sorted({str(param(r, "model")) for rs in groups.values() for r in rs})
        for model in models:
            mgroups = {k: v for k, v in groups.items() if str(param(v[0], "model")) == model}
            styled = self._styled(mgroups)
            per_head, relative = [], []
            table = []
            for gkey, label, style, _full in styled:
                rs = sorted(mgroups[gkey], key=lambda r: param(r, "num_heads"))
                hs = [param(r, "num_heads") for r in rs]
                ys = [median_ms(r) / h for r, h in zip(rs, hs, strict=True)]
                per_head.append(plots.Series(label, hs, ys, **style))
                if ys[-1] > 0:
                    relative.append(plots.Series(label, hs, [y / ys[-1] for y in ys], **style))
                for r, h, y in zip(rs, hs, ys, strict=True):
                    padded = (r.get("info") or {}).get("padded_heads")
                    table.append(
                        [
                            _code(r["case_id"]),
                            label,
                            h,
                            padded or "",
                            _fmt(median_ms(r)),
                            _fmt(y),
                            f"{y / ys[-1]:.2f}" if ys[-1] > 0 else "",
                            _pct(h / padded) if isinstance(padded, int) and padded else "",
                        ]
                    )
            panels = [
                plots.Panel(
                    "time per useful head",
                    "useful heads per rank",
                    "ms per useful head",
                    per_head,
                    logx=True,
                ),
                plots.Panel(
                    "relative to the largest head count",
                    "useful heads per rank",
                    "time per head / time per head at most heads",
                    relative,
                    logx=True,
                    hlines=[(1.0, "per-head cost at the most heads", "0.4")],
                ),
            ]
            fig = plots.line_figure(f"Head-padding overhead: {model}", panels, max_cols=2)
            d.heading(f"Head padding: {model}", 3)
            d.image(self.save(fig, _slug("head-padding", model)), f"head padding {model}")
            d.table(
                [
                    "case_id",
                    "series",
                    "heads",
                    "padded heads",
                    "median ms",
                    "ms/head",
                    "relative",
                    "useful",
                ],
                table,
                caption=f"Head-padding rows, {model}",
            )

    # ---- environment and failures -----------------------------------------------------------

    def environment(self) -> None:
        envs: dict[tuple[str, str], dict] = {}
        for r in self.rows:
            env = r.get("env")
            if isinstance(env, dict) and env:
                envs.setdefault((r["_run"], json.dumps(env, sort_keys=True, default=str)), env)
        providers = {}
        for r in self.rows:
            p = r.get("provider")
            if isinstance(p, dict) and p:
                key = (
                    r["_run"],
                    r.get("backend"),
                    p.get("name"),
                    p.get("version"),
                    p.get("location"),
                )
                providers[key] = key
        if not envs and not providers:
            self.left_out.append("Environment: no row records its environment.")
            return
        d = self.doc
        d.heading("Environment")
        cols = ["gpu", "arch", "driver", "cuda", "torch", "triton", "git_commit"]
        more = ["smem_per_block_optin", "sm_count", "python", "host"]
        cols += [c for c in more if any(e.get(c) for e in envs.values())]
        d.table(
            ["run", *cols],
            [
                [run, *[_fmt(e.get(c)) for c in cols]]
                for (run, _), e in sorted(envs.items(), key=lambda kv: kv[0])
            ],
        )
        d.table(
            ["run", "backend", "provider", "version", "location"],
            [list(k) for k in sorted(providers, key=lambda k: tuple(map(str, k)))],
            caption="Kernel providers",
        )

    def failures(self) -> None:
        bad = [r for r in self.rows if r["kind"] in ("case", "limit") and r["status"] != "ok"]
        if not bad:
            self.left_out.append("Failures: every case row is ok.")
            return
        d = self.doc
        d.heading("Failures and unsupported cases")
        order = {s: i for i, s in enumerate(FAILURE_ORDER)}
        bad.sort(key=lambda r: (order.get(r["status"], 99), self.who(r), r["case_id"]))
        counts = Counter(r["status"] for r in bad)
        d.para(
            ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: order.get(s, 99)))
            + ". Limit probes fail on purpose (they look for the crash); they carry the tag "
            "`limit-probe`."
        )
        d.table(
            ["status", "backend", "case_id", "tags", "message"],
            [
                [
                    r["status"],
                    self.who(r),
                    _code(r["case_id"]),
                    ", ".join(r.get("tags") or []) or ("limit" if r["kind"] == "limit" else ""),
                    short(r.get("message"), 200),
                ]
                for r in bad
            ],
            caption="Rows that are not ok",
        )


def _serving_series(pts: list[dict], x_key: str, **style) -> plots.Series:
    """Serving points along x_key: measured ones as a line, failed ones (no value) as marks."""
    placed = [r for r in pts if _is_num(r.get(x_key))]
    ok = [r for r in placed if r.get("value_ms") is not None]
    return plots.Series(
        xs=[r[x_key] for r in ok],
        ys=[r["value_ms"] for r in ok],
        failed_xs=[r[x_key] for r in placed if r.get("value_ms") is None],
        **style,
    )
