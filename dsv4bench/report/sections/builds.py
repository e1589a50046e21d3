"""Instances of one backend side by side (two FlashMLA builds): limits, speed, accuracy.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.report.builds import instance_groups, paragraph


def builds(rep) -> None:
    groups = instance_groups(rep.rows)
    if not groups:
        rep.left_out.append("Instances side by side: no run with two instances of one backend.")
        return
    d = rep.doc
    d.heading("Backend instances side by side")
    d.para(
        "Instances of one backend in one run (for example two FlashMLA builds, each with its "
        "own library): cases ok, the largest cos_diff against the oracle, the time against the "
        "first instance (geometric mean of per-case time ratios over the cases both ran ok, "
        "each by the timer both rows measured: below 1 is faster) and each instance's limit "
        "searches. "
        "`dsv4bench compare RUN --backends A B` lists every case."
    )
    for group in groups:
        d.bullets([paragraph(inst) for inst in group])
        limits = sorted({lim.what for inst in group for lim in inst.limits})
        rows = []
        for inst in group:
            by_what = {lim.what: lim for lim in inst.limits}
            speed = "1 (reference)" if inst.name == inst.reference else inst.speed
            rows.append(
                [
                    inst.name,
                    f"{inst.ok}/{inst.cases}",
                    f"{speed:.3f}" if isinstance(speed, float) else (speed or ""),
                    f"{inst.max_cos_diff:.3g}" if inst.max_cos_diff is not None else "",
                    *[by_what[w].text() if w in by_what else "" for w in limits],
                ]
            )
        d.table(
            ["instance", "ok", "time vs first", "max cos_diff", *[f"limit: {w}" for w in limits]],
            rows,
            caption=f"{len(group)} instances of {group[0].base}",
        )
