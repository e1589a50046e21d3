"""Where each warp-specialized partition of a kernel waits, from Nsight Compute's per-instruction
warp-state samples: the SASS is cut at the partitions' register hand-overs (USETMAXREG), and
each part gets its share of the samples, its top stall reasons and its hottest instructions.

    ncu --section SourceCounters -o rep ...   (one launch, e.g. tools/gluon_breakdown.py --ncu)
    ncu -i rep.ncu-rep --page source --csv --print-source sass | \\
        python3 tools/ncu_partition_stalls.py [--top N]

A kernel without warp specialization comes out as one part. Each "Kernel Name" block of the
input (one per profiled launch) is reported on its own.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def _kernels(lines):
    """(kernel name, header, rows) for each kernel block of the CSV."""
    name, header, rows = None, None, []
    for row in csv.reader(lines):
        if row and row[0] == "Kernel Name":
            if header:
                yield name, header, rows
            name, header, rows = row[1], None, []
        elif header is None and SAMPLES in row:
            header = row
        elif header and len(row) == len(header):
            rows.append(row)
    if header:
        yield name, header, rows


def _parts(rows, source: int) -> list[list]:
    """The rows cut before each register hand-over: a partition's code starts there."""
    parts, cur = [], []
    for row in rows:
        if "USETMAXREG" in row[source] and cur:
            parts.append(cur)
            cur = []
        cur.append(row)
    return parts + [cur] if cur else parts


def _waits_on_mbarrier(part: list[list], i: int, src: int) -> bool:
    """Whether instruction i is the retry branch of an mbarrier wait: a branch on the
    predicate that a SYNCS.PHASECHK (try-wait) a few instructions before it sets."""
    pred = re.match(r"@!?(P\d)\s", part[i][src].strip())
    if not pred or "BRA" not in part[i][src]:
        return False
    return any("SYNCS.PHASECHK" in r[src] and f" {pred.group(1)}," in r[src]
               for r in part[max(0, i - 8):i])  # fmt: skip


def report(name: str, header: list[str], rows: list[list], top: int) -> str:
    col = {h: i for i, h in enumerate(header)}
    src = col["Source"]
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[col[SAMPLES]]) for r in rows) or 1
    out = [f"{name}: {total} samples, {len(rows)} instructions"]
    for k, part in enumerate(_parts(rows, src)):
        n = sum(int(r[col[SAMPLES]]) for r in part)
        if n < total * 0.01:
            continue
        why = {s: sum(int(r[col[s]]) for r in part) for s in stalls}
        reasons = ", ".join(f"{s[6:]} {v / n:.0%}" for s, v in
                            sorted(why.items(), key=lambda kv: -kv[1])[:4])  # fmt: skip
        out.append(f"  part {k} ({part[0][src].strip()[:40]}): {n / total:.1%} of samples; "
                   f"{reasons}")  # fmt: skip
        hot = sorted(range(len(part)), key=lambda i: -int(part[i][col[SAMPLES]]))[:top]
        for i in hot:
            r = part[i]
            s = int(r[col[SAMPLES]])
            main = max(stalls, key=lambda h: int(r[col[h]]))
            what = r[src].strip()[:60]
            if _waits_on_mbarrier(part, i, src):
                what += "  (mbarrier wait)"
            out.append(f"      {s / n:6.1%} {main[6:]:<12} {what}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=6, help="hottest instructions shown a part")
    a = ap.parse_args()
    found = False
    for name, header, rows in _kernels(sys.stdin):
        found = True
        print(report(name, header, rows, a.top))
    if not found:
        print("no per-instruction samples in the input (ncu --page source --csv)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
