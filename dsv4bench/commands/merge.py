"""`dsv4bench merge`: shard run directories into one (and their serving points)."""

from __future__ import annotations

import sys
from pathlib import Path

from dsv4bench.commands.common import UsageError, load, setup_backends
from dsv4bench.commands.run import serving_rows


def cmd_merge(args) -> int:
    from dsv4bench.rows.results import ResultWriter
    from dsv4bench.run import merge

    out = Path(args.out)
    command = " ".join(["dsv4bench", *args.argv])
    try:
        record = merge.merge(
            [Path(p) for p in args.run_dir],
            out,
            allow_mixed=args.allow_mixed,
            partial=args.partial,
            command=command,
        )
    except merge.MergeError as e:
        raise UsageError(str(e)) from None
    rows = sum(p["rows"] for p in record["parts"])
    print(f"merged {len(record['parts'])} run(s), {rows} rows -> {out / 'results.jsonl'}")
    if args.serving:
        setup_backends(args)
        _jobs, _limits, specs = load(args.serving, None)
        print(
            f"serving: {serving_rows(specs, ResultWriter(out))} TTFT/TPOT points",
            file=sys.stderr,
        )
    return 0
