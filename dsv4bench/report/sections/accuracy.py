"""Accuracy against the oracle per case family, judged with each row's own tolerance.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from dsv4bench.report import plots
from dsv4bench.report.fmt import (
    code_span,
    sci,
)
from dsv4bench.report.load import (
    accuracy_failure,
    case_rows,
    family,
    tolerance,
)


def accuracy(rep) -> None:
    rows = [
        r
        for r in case_rows(rep.rows)
        if isinstance((r.get("accuracy") or {}).get("cos_diff"), (int, float))
    ]
    if not rows:
        rep.left_out.append("Accuracy: no rows with an accuracy measurement.")
        return
    d = rep.doc
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
        fam, who = family(r), rep.who(r)
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
    d.image(rep.save(fig, "accuracy"), "accuracy per case family")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(family(r), rep.who(r))].append(r)
    table = []
    for (fam, who), rs in sorted(groups.items()):
        worst = max(rs, key=lambda r: r["accuracy"]["cos_diff"])
        lses = [r["accuracy"].get("lse_max_abs") for r in rs]
        lses = [x for x in lses if isinstance(x, (int, float))]
        beyond = sum(1 for r in rs if r["status"] == "incorrect" or accuracy_failure(r) is not None)
        table.append(
            [
                fam,
                who,
                len(rs),
                sci(worst["accuracy"]["cos_diff"]),
                code_span(worst["case_id"]),
                sci(max(lses)) if lses else "",
                sci(tolerance(worst)["cos_diff"]),
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
