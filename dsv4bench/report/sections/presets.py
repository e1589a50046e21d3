"""Engine presets against the envelope: what sglang and vLLM run by default (serving/presets.py)
on the serving points measured, next to the envelope and the fastest correct backend per phase,
with the flags that select each and the sources of the defaults.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.report import plots
from dsv4bench.report.fmt import fmt_num, kilo, make_slug
from dsv4bench.report.sections.serving_backends import ENVELOPE_STYLE
from dsv4bench.serving import presets as pz
from dsv4bench.serving import recommend
from dsv4bench.serving.aggregate import ENVELOPE

INTRO = (
    "What each engine runs by default for sparse MLA (sources below), computed from the "
    "serving points measured here: TTFT on the preset's prefill backend and route, TPOT on its "
    "decode backend. A bf16-cache engine pays no FP8 dequant on the sparse-prefill route, so a "
    "bf16 candidate's TTFT is the row's value less its dequant part. `envelope`: every "
    "attention call on the fastest backend that ran it, as the serving rows have it (dequant "
    "parts included). The fastest correct "
    "candidate per phase and the flags that select it: `dsv4bench recommend RUN_DIR --model M "
    "--tp N`."
)


def engine_presets(rep) -> None:
    serving = [r for r in rep.rows if r.get("kind") == "serving"]
    runs = sorted({r.get("_run") for r in serving}, key=str)
    shown = False
    # one run at a time: a phase pairs the rows of one run only
    for run, model, tp in sorted({(r.get("_run"), r.get("model"), r.get("tp") or 1)
                                  for r in serving}, key=str):  # fmt: skip
        rows = [r for r in serving if r.get("_run") == run]
        arch = next((r["env"]["arch"] for r in rows if (r.get("env") or {}).get("arch")), None)
        presets = pz.presets_for(model, arch)
        advice = recommend.advise(rows, model, tp)
        if not presets or not advice:
            continue
        if not shown:
            rep.doc.heading("Engine presets against the envelope")
            rep.doc.para(INTRO)
            shown = True
        title = f"{model}, TP {tp}" + (f", run {run}" if len(runs) > 1 else "")
        rep.doc.heading(title, 3)
        _summary(rep, presets, advice, model)
        caveats = recommend.Caveats(rep.rows)  # a case of any run of the report
        for metric, a in advice.items():
            said = caveats.of(a.best[0].backend) if a.best else ""
            if said:
                rep.doc.para(
                    f"The fastest {recommend.METRICS[metric]} candidate, "
                    f"{a.best[0].label()}, is correct at these points only: {said}."
                )
        for metric, a in advice.items():
            _curves(rep, title, metric, a, presets)
    if shown:
        rep.doc.bullets(_sources())
    else:
        rep.left_out.append("Engine presets: no serving rows of a model an engine preset covers.")


def _summary(rep, presets: list[pz.Preset], advice: dict, model: str) -> None:
    table = []
    for p in presets:
        cells = [p.name, p.engine_label(), p.gpu, p.kv]
        for metric in ("ttft", "tpot"):
            a = advice.get(metric)
            cand = pz.preset_candidate(p, metric)
            value = pz.value_on(a.phase, cand, a.ranking.points) if a else None
            best = a.best if a else None
            cells += [cand.label(), fmt_num(value) if value is not None else "not measured"]
            cells.append(f"{value / best[1]:.2f}x" if value is not None and best else "")
        table.append(cells)
    best_row = ["fastest correct", "", "", ""]
    for metric in ("ttft", "tpot"):
        a = advice.get(metric)
        if a and a.best:
            cand, value = a.best
            best_row += [cand.label(), fmt_num(value), pz.flags_for(cand, metric, model)]
        else:
            best_row += ["", "", ""]
    table.append(best_row)
    rep.doc.table(
        ["preset", "engine", "for", "KV", "TTFT from", "TTFT ms", "vs fastest", "TPOT from"]
        + ["TPOT ms", "vs fastest"],
        table,
        caption="each phase summed over the points every ranked candidate ran ok; the last row: "
        "the fastest correct candidate and, under `vs fastest`, the flags selecting it",
    )


def _curves(rep, title: str, metric: str, a, presets: list[pz.Preset]) -> None:
    """One line per distinct preset candidate and the envelope, per panel (TTFT: chunk size,
    x prompt length; TPOT: context, x batch), and the same numbers as a table."""
    cands: dict[pz.Candidate, list[str]] = {}
    for p in presets:
        cands.setdefault(pz.preset_candidate(p, metric), []).append(p.name)
    colors = plots.colors_for([c.label() for c in cands])
    panel_of = {k: k[1] for k in a.phase.points}  # chunk size (ttft) or context (tpot)
    panels = []
    for fixed in sorted(set(panel_of.values()), key=lambda v: v or 0):
        keys = sorted((k for k in a.phase.points if panel_of[k] == fixed), key=lambda k: k[0] or 0)
        series = []
        for cand, names in cands.items():
            v = a.phase.values.get(cand, {})
            at = [k for k in keys if k in v]
            label = f"{cand.label()}: {', '.join(names)}"
            if at:
                ys = [v[k] for k in at]
                color = colors[cand.label()]
                series.append(plots.Series(label, [k[0] for k in at], ys, color=color))
        env = [k for k in keys if k in a.phase.envelope]
        if env:
            style = {k: v for k, v in ENVELOPE_STYLE.items() if k != "color"}
            series.append(
                plots.Series(
                    ENVELOPE,
                    [k[0] for k in env],
                    [a.phase.envelope[k] for k in env],
                    color=ENVELOPE_STYLE["color"],
                    **style,
                )
            )
        ttft = metric == "ttft"
        panels.append(
            plots.Panel(
                f"chunk {kilo(fixed)}" if ttft else f"context {kilo(fixed)}",
                "prompt length (tokens)" if ttft else "batch size (requests)",
                f"{metric.upper()} attention part (ms)",
                series,
                note="no points",
            )
        )
    name = f"{metric.upper()} of the engine presets: {title}"
    fig = plots.line_figure(name, panels)
    rep.doc.image(rep.save(fig, make_slug(f"presets-{metric}", title)), name)
    head = ["point", *[f"{c.label()} ms" for c in cands], f"{ENVELOPE} ms"]
    table = []
    for k in a.phase.points:
        cells = [
            f"prompt {k[0]}, chunk {kilo(k[1])}"
            if metric == "ttft"
            else f"batch {k[0]}, context {kilo(k[1])}"
        ]
        cells += [fmt_num(a.phase.values.get(c, {}).get(k)) for c in cands]
        cells.append(fmt_num(a.phase.envelope.get(k)))
        table.append(cells)
    rep.doc.table(head, table, caption=name)


def _sources() -> list[str]:
    out = []
    for p in pz.PRESETS:
        note = f" Not modelled: {p.note}." if p.note else ""
        out.append(
            f"**{p.name}** ({p.engine_label()}, {p.gpu}): {p.flags}. Source: {p.source}.{note}"
        )
    return out
