"""Every case that was not ok, with its reason.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from collections import Counter

from dsv4bench.report.fmt import (
    code_span,
)
from dsv4bench.report.load import (
    short,
)

FAILURE_ORDER = ("incorrect", "crash", "oom", "timeout", "error", "unsupported")


def failures(rep) -> None:
    bad = [r for r in rep.rows if r["kind"] in ("case", "limit") and r["status"] != "ok"]
    if not bad:
        rep.left_out.append("Failures: every case row is ok.")
        return
    d = rep.doc
    d.heading("Failures and unsupported cases")
    order = {s: i for i, s in enumerate(FAILURE_ORDER)}
    bad.sort(key=lambda r: (order.get(r["status"], 99), rep.who(r), r["case_id"]))
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
                rep.who(r),
                code_span(r["case_id"]),
                ", ".join(r.get("tags") or []) or ("limit" if r["kind"] == "limit" else ""),
                short(r.get("message"), 200),
            ]
            for r in bad
        ],
        caption="Rows that are not ok",
    )
