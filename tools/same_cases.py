"""Do two runs hold the same cases with the same statuses? Prints every difference.

    python tools/same_cases.py RUN_A RUN_B

A case is (kind, case_id, backend, limit probe or not); its outcome is the status of its last
row, and for a limit search also last_ok/first_fail. Exit 0: the same; 1: they differ; 2: a
run directory without results.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4bench.rows.results import RESULTS_FILE, read_rows  # noqa: E402
from dsv4bench.run.merge import row_key  # noqa: E402


def outcomes(run: Path) -> dict[tuple, str]:
    found = {}
    for r in read_rows(run):
        outcome = str(r.get("status"))
        if r.get("kind") == "limit":
            outcome += f" (last_ok {r.get('last_ok')}, first_fail {r.get('first_fail')})"
        found[row_key(r)] = outcome
    return found


def differences(a: dict, b: dict, name_a: str, name_b: str) -> list[str]:
    show = lambda k: f"{k[0]} {k[1]} {k[2]}" + (" (limit probe)" if k[3] else "")
    lines = [f"only in {name_a}: {show(k)} {a[k]}" for k in sorted(a.keys() - b.keys(), key=str)]
    lines += [f"only in {name_b}: {show(k)} {b[k]}" for k in sorted(b.keys() - a.keys(), key=str)]
    lines += [
        f"status differs: {show(k)}: {a[k]} in {name_a}, {b[k]} in {name_b}"
        for k in sorted(a.keys() & b.keys(), key=str)
        if a[k] != b[k]
    ]
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: same_cases.py RUN_A RUN_B", file=sys.stderr)
        return 2
    runs = [Path(p) for p in argv]
    for run in runs:
        if not (run / RESULTS_FILE).is_file():
            print(f"same_cases: {run}: no {RESULTS_FILE}", file=sys.stderr)
            return 2
    a, b = (outcomes(r) for r in runs)
    diff = differences(a, b, *argv)
    for line in diff:
        print(line)
    counts = Counter(s.split(" ")[0] for s in a.values())
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if diff:
        print(f"{len(diff)} difference(s); {argv[0]}: {len(a)} cases, {argv[1]}: {len(b)} cases")
        return 1
    print(f"same cases, same statuses: {len(a)} ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
