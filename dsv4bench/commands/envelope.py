"""`dsv4bench envelope`: the support envelope of a scenario's backends, as rows, a grid
picture and a capability table. Without --rows it is the plan (CPU only); with the rows of a
`dsv4bench run` of the same scenario, crashes and mismatches fill their cells."""

from __future__ import annotations

from pathlib import Path

from dsv4bench.cases.case import ARCHS
from dsv4bench.commands.common import UsageError, load, setup_backends

HELP = "the support grid (heads x top-k x s_q x layout x phase) per backend, plot and table"


def add_parser(sub, common) -> None:
    p = sub.add_parser("envelope", help=HELP)
    p.add_argument("scenario", nargs="+", help="envelope scenarios (scenarios/envelope/*.yaml)")
    p.add_argument("--arch", required=True, choices=ARCHS, help="the architecture to plan for")
    p.add_argument("--out", required=True, metavar="DIR", help="where the files go")
    p.add_argument(
        "--rows", metavar="RUN_DIR", help="a run of the same scenarios: its rows fill the cells"
    )
    common(p)
    p.set_defaults(func=cmd_envelope)


def _rows(run_dir: str | None) -> list[dict]:
    if run_dir is None:
        return []
    from dsv4bench.rows.results import read_rows, rows_file

    if not rows_file(run_dir).exists():
        raise UsageError(f"--rows {run_dir}: no results.jsonl there")
    return [r for r in read_rows(run_dir) if isinstance(r, dict)]


def _probe():
    """The capability probe: one V4-Flash C4 decode step (window, extra cache, sink)."""
    from dsv4bench.cases.case import Case
    from reference.models import V4_FLASH as m

    return Case(
        "capabilities", "decode", m.name, m.d_qk, m.d_v, m.num_heads, topk=m.window,
        extra_topk=m.index_topk, context_len=4096, page_size=m.page_size,
        layout=m.cache_layout, sink=True, window=m.window, compress_ratio=4,
    )  # fmt: skip


def cmd_envelope(args) -> int:
    from dsv4bench import backends
    from dsv4bench.report import capabilities, envelope
    from dsv4bench.report.plots import envelope as plot

    setup_backends(args)
    jobs, limits, specs = load(args.scenario, args.backend)
    if limits or specs:
        raise UsageError("envelope takes scenarios of cases only (no limit or serving entries)")
    rows = _rows(args.rows)
    out = Path(args.out)

    def supports(job):
        return backends.get(job.backend).supports(job.case, args.arch)

    cells = envelope.cells(jobs, args.arch, supports, rows)
    envelope.write_cells(cells, out / "envelope.jsonl")
    plot.draw(cells, out / "envelope.png", f"Support envelope on {args.arch}")
    probe = _probe()
    names = dict.fromkeys(job.backend for job in jobs)
    table = {n: capabilities.capability_row(backends.get(n), probe, args.arch, rows) for n in names}
    (out / "capabilities.md").write_text(capabilities.table(table))
    for name, by_status in envelope.counts(cells).items():
        print(f"{name}: " + ", ".join(f"{n} {s}" for s, n in by_status.items() if n))
    print(f"{len(cells)} cells -> {out}")
    return 0
