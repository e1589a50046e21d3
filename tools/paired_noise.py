"""How often the paired gate (dsv4bench/history/paired.py) raises a false alarm and how often it
catches a planted slowdown, from runs made on one machine: FOLDER/u1, u2, ... (unplanted) and
FOLDER/p1, p2, ... (planted: tests/plugins/planted_slowdown.py), each p<i> made right after
u<i>. A false alarm: a pair u<i>, u<i+1> the gate fails; a catch: u<i>, p<i> failed with
PLANTED (torch) the backend regressed and no other. docs/history.md gives the loop that makes
the runs and the numbers measured.

    python3 tools/paired_noise.py FOLDER [FOLDER ...] [--threshold 0.05]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dsv4bench.history import paired, store

PLANTED = "torch"


def _runs(folder: Path, prefix: str) -> dict[int, Path]:
    found = {}
    for p in folder.glob(f"{prefix}*"):
        m = re.fullmatch(rf"{prefix}(\d+)", p.name)
        if m and (p / "results.jsonl").is_file():
            found[int(m.group(1))] = p
    return found


def _backends(base: Path, new: Path, threshold: float) -> dict[str, tuple[float, str]]:
    verdicts = paired.judge_pair(store.entry_of(base), store.entry_of(new), threshold)
    return {v.backend: (v.ratio, v.kind) for v in verdicts if v.key.startswith("median of ")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="+", type=Path)
    ap.add_argument("--threshold", type=float, default=0.05)
    args = ap.parse_args()
    for folder in args.folder:
        unplanted, planted = _runs(folder, "u"), _runs(folder, "p")
        alarms, pairs, ratios = 0, 0, []
        for i in sorted(unplanted):
            if i + 1 in unplanted:
                got = _backends(unplanted[i], unplanted[i + 1], args.threshold)
                pairs += 1
                alarms += any(kind == "time" for _, kind in got.values())
                ratios += [r for r, _ in got.values()]
        caught, tried, seen = 0, 0, []
        for i in sorted(planted):
            if i in unplanted:
                got = _backends(unplanted[i], planted[i], args.threshold)
                tried += 1
                bad = {b for b, (_, kind) in got.items() if kind == "time"}
                caught += bad == {PLANTED}
                seen.append(got[PLANTED][0])
        print(
            f"{folder}: false alarms {alarms}/{pairs} unplanted pairs "
            f"(backend medians x{min(ratios, default=1):.3f}..x{max(ratios, default=1):.3f}); "
            f"caught {caught}/{tried} planted (torch x{min(seen, default=1):.3f}.."
            f"x{max(seen, default=1):.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
