"""compare.md as a list of sections (SECTIONS, in order), each a function of the comparison.

Adding a table or a plot to the regression report means adding one function here and listing
it in SECTIONS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4bench.report.compare_rules import (
    MIN_SAMPLES,
    RULES,
    Entry,
    accuracy_bad,
    counts,
    sample_count,
    spread,
)
from dsv4bench.report.doc import Doc
from dsv4bench.report.load import short


@dataclass
class Comparison:
    entries: list[Entry]
    base: Path
    new: Path
    threshold: float
    png: Path | None  # the time-ratio plot, when any case was timed on both sides
    base_rows: list[dict]
    new_rows: list[dict]
    backends: tuple[str, str] | None = None  # two instances compared: base's A, new's B

    def matched(self, kind: str) -> list[Entry]:
        """Entries present on both sides whose base row is of this kind (case or limit)."""
        return [e for e in self.entries if e.base and e.new and e.base.get("kind") == kind]


def document(c: Comparison) -> Doc:
    doc = Doc("dsv4bench compare")
    for section in SECTIONS:
        section(doc, c)
    return doc


def _ms(v) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else ""


def _median(timing: dict | None) -> str:
    return _ms((timing or {}).get("median_ms"))


def _spread_text(timing: dict | None) -> str:
    lo, hi, _ = spread(timing or {})
    return f"{lo:.4g}–{hi:.4g}" if lo is not None else ""


def _acc(row: dict, key: str) -> str:
    v = (row.get("accuracy") or {}).get(key)
    return f"{v:.2e}" if isinstance(v, (int, float)) else ""


def devices(rows: list[dict]) -> list[str]:
    """The machines a side's rows were measured on: each GPU model, "CPU" for a CPU run; rows
    that record neither (pytest-benchmark JSON) name none."""
    found = set()
    for r in rows:
        env = r.get("env")
        if isinstance(env, dict) and (env.get("gpu") or env.get("arch") == "cpu"):
            found.add(str(env.get("gpu") or "CPU"))
    return sorted(found)


def devices_line(base_rows: list[dict], new_rows: list[dict]) -> str:
    """Where each side ran, and a warning when the machines differ (a time ratio then compares
    the machines as much as the kernels)."""
    base, new = devices(base_rows), devices(new_rows)
    name = lambda found: " + ".join(found) or "an unrecorded device"
    line = f"base on {name(base)}, new on {name(new)}"
    if base and new and base != new:
        line += ": different devices, so time ratios compare the machines too"
    return line


def summary(doc: Doc, c: Comparison) -> None:
    n = counts(c.entries)
    doc.bullets(
        [
            f"base: `{c.base}`" + (f", backend `{c.backends[0]}`" if c.backends else ""),
            f"new: `{c.new}`" + (f", backend `{c.backends[1]}`" if c.backends else ""),
            devices_line(c.base_rows, c.new_rows),
            f"time threshold: {c.threshold:g} (median and p10 ratios > {1 + c.threshold:g}, "
            f"n >= {MIN_SAMPLES} on both sides, new p10 > base p90)",
        ]
    )
    verdict = "**REGRESSION**" if n["regressions"] else "no regression"
    doc.para(
        f"{verdict}: {n['matched']} matched, {n['regressions']} with a regression "
        f"({n['time']} time, {n['accuracy']} accuracy, {n['status']} status, {n['limit']} limit, "
        f"{n['missing']} missing"
        + (f", {n['unbaselined']} not in base" if n["unbaselined"] else "")
        + "); "
        f"{n['only_base']} only in base, {n['only_new']} only in new."
    )


def regressions(doc: Doc, c: Comparison) -> None:
    doc.heading("Regressions")
    found = [[k, f"`{e.case_id}`", e.backend, d] for e in c.entries for k, d in e.regressions]
    if found:
        doc.table(["kind", "case_id", "backend", "detail"], found)
    else:
        doc.para("None.")


def time_ratios(doc: Doc, c: Comparison) -> None:
    timed = sorted((e for e in c.entries if e.ratio is not None), key=lambda e: -e.ratio)
    if not timed:
        return
    doc.heading("Time ratios, worst first")
    if c.png:
        doc.image(c.png, "time ratios new/base")
    head = ["case_id", "backend", "base ms", "new ms", "new / base"]
    head += ["base p10–p90", "new p10–p90", "n base/new", "verdict"]
    table = []
    for e in timed:
        b, n = e.base["timing"], e.new["timing"]
        table.append(
            [f"`{e.case_id}`", e.backend, _median(b), _median(n), f"{e.ratio:.3f}"]
            + [_spread_text(b), _spread_text(n)]
            + [f"{sample_count(b or {})}/{sample_count(n or {})}", e.verdict]
        )
    doc.table(head, table)


def status_changes(doc: Doc, c: Comparison) -> None:
    changed = [e for e in c.matched("case") if e.base.get("status") != e.new.get("status")]
    if not changed:
        return
    doc.heading("Status changes")
    doc.table(
        ["case_id", "backend", "base", "new", "new message"],
        [
            [f"`{e.case_id}`", e.backend, e.base.get("status"), e.new.get("status")]
            + [short(e.new.get("message"), 160)]
            for e in changed
        ],
    )


def accuracy(doc: Doc, c: Comparison) -> None:
    bad = [e for e in c.matched("case") if accuracy_bad(e.base) or accuracy_bad(e.new)]
    if not bad:
        return
    doc.heading("Accuracy beyond tolerance (either side)")
    head = ["case_id", "backend", "base cos_diff", "new cos_diff"]
    head += ["base lse err", "new lse err", "new"]
    doc.table(
        head,
        [
            [f"`{e.case_id}`", e.backend, _acc(e.base, "cos_diff"), _acc(e.new, "cos_diff")]
            + [_acc(e.base, "lse_max_abs"), _acc(e.new, "lse_max_abs")]
            + [accuracy_bad(e.new) or "within"]
            for e in bad
        ],
    )


def limits(doc: Doc, c: Comparison) -> None:
    found = c.matched("limit")
    if not found:
        return
    doc.heading("Measured limits")
    head = ["limit", "backend", "base last ok", "base first fail", "new last ok"]
    doc.table(
        [*head, "new first fail"],
        [
            [f"`{e.case_id}`", e.backend, e.base.get("last_ok"), e.base.get("first_fail")]
            + [e.new.get("last_ok"), e.new.get("first_fail")]
            for e in found
        ],
    )


def one_side_only(doc: Doc, c: Comparison) -> None:
    for side, title in (("base", "Only in base"), ("new", "Only in new")):
        only = [e for e in c.entries if (e.new is None if side == "base" else e.base is None)]
        if only:
            doc.heading(title)
            doc.table(
                ["case_id", "backend", "status"],
                [[f"`{e.case_id}`", e.backend, (e.base or e.new).get("status")] for e in only],
            )


def serving_points(doc: Doc, c: Comparison) -> None:
    """Serving points of both sides (informational: their kernel rows carry the verdicts)."""

    def keyed(rows):
        return {
            (str(r.get("case_id")), str(r.get("backend"))): r
            for r in rows
            if r.get("kind") == "serving" and r.get("case_id")
        }

    base, new = keyed(c.base_rows), keyed(c.new_rows)
    pairs = []
    for key in sorted(set(base) & set(new)):
        b, n = base[key].get("value_ms"), new[key].get("value_ms")
        ratio = n / b if isinstance(b, (int, float)) and isinstance(n, (int, float)) and b else None
        pairs.append((key, base[key], new[key], ratio))
    if not pairs:
        return
    pairs.sort(key=lambda p: (-(p[3] or 0.0), p[0]))
    doc.heading("Serving points (informational)")
    doc.para(
        "TTFT/TPOT attention parts of both runs, worst new / base first; the kernel rows behind "
        "them carry the regression verdicts."
    )
    doc.table(
        ["point", "backend", "base ms", "new ms", "new / base", "base status", "new status"],
        [
            [f"`{k[0]}`", k[1], _ms(b.get("value_ms")), _ms(n.get("value_ms"))]
            + [f"{r:.3f}" if r is not None else "", b.get("status"), n.get("status")]
            for k, b, n, r in pairs
        ],
        folded=len(pairs) > 20,
        caption="Serving points",
    )


def rules(doc: Doc, c: Comparison) -> None:
    doc.heading("Rules")
    doc.bullets(list(RULES))


SECTIONS = (
    summary,
    regressions,
    time_ratios,
    status_changes,
    accuracy,
    limits,
    one_side_only,
    serving_points,
    rules,
)
