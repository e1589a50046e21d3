"""What the report is made of (runs, rows per backend and status) and the environment.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from dsv4bench.report import plots
from dsv4bench.report.fmt import (
    code_span,
    fmt_num,
)
from dsv4bench.report.load import case_rows, last_case_rows


def shown(path) -> str:
    """A run's path as the report shows it: relative to the current directory when inside it,
    so one run renders the same report whichever way its path was written."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def intro(rep) -> None:
    d = rep.doc
    kinds_by_run = {
        run: Counter(r["kind"] for r in rep.rows if r["_run"] == run) for run in rep.runs
    }
    d.table(
        ["run", "path", "case rows", "limit rows", "serving rows"],
        [
            [run, code_span(shown(path)), c.get("case", 0), c.get("limit", 0), c.get("serving", 0)]
            for (run, c), path in zip(kinds_by_run.items(), rep.paths, strict=True)
        ],
    )
    rows, cases = case_rows(rep.rows), last_case_rows(rep.rows)
    if not rep.rows:
        d.para("These runs hold no rows yet.")
    if cases:
        statuses = [s for s in plots.STATUS_ORDER if any(r["status"] == s for r in cases)]
        per = defaultdict(Counter)
        for r in cases:
            per[rep.who(r)][r["status"]] += 1
        again = len(rows) - len(cases)
        d.para(
            "Rows per backend and status (limit probes included):"
            if not again
            else f"Cases per backend and status (limit probes included; {again} rows of a case "
            "written again, re-run or re-judged, are left out: a case counts once, by its last "
            "row):"
        )
        d.table(
            ["backend", *statuses, "total"],
            [
                [b, *[c.get(s, 0) or "" for s in statuses], sum(c.values())]
                for b, c in sorted(per.items())
            ],
        )
    if rep.left_out:
        d.para("Left out for lack of data:")
        d.bullets(rep.left_out)


def environment(rep) -> None:
    envs: dict[tuple[str, str], dict] = {}
    for r in rep.rows:
        env = r.get("env")
        if isinstance(env, dict) and env:
            envs.setdefault((r["_run"], json.dumps(env, sort_keys=True, default=str)), env)
    providers = {}
    for r in rep.rows:
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
        rep.left_out.append("Environment: no row records its environment.")
        return
    d = rep.doc
    d.heading("Environment")
    cols = ["gpu", "arch", "driver", "cuda", "torch", "triton", "git_commit"]
    more = ["gpu_index", "gpu_uuid", "smem_per_block_optin", "sm_count", "python", "host"]
    cols += [c for c in more if any(e.get(c) for e in envs.values())]
    d.table(
        ["run", *cols],
        [
            [run, *[fmt_num(e.get(c)) for c in cols]]
            for (run, _), e in sorted(envs.items(), key=lambda kv: kv[0])
        ],
    )
    d.table(
        ["run", "backend", "provider", "version", "location"],
        [list(k) for k in sorted(providers, key=lambda k: tuple(map(str, k)))],
        caption="Kernel providers",
    )
