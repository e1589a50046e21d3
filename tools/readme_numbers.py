"""The figures the READMEs and docs cite, recomputed from the committed rows.

A cited figure is marked in its markdown file as `<!-- n:NAME -->VALUE<!-- /n -->`; FIGURES
(tools/figures/, a module per study) says how NAME is computed (with the report's own code, so
a figure reads as the report does). `--check` (CI, `.ci/run`) fails with one line per figure
whose text no longer matches its rows, and on a marker of an unknown name; `--write` puts the
recomputed values in. In the findings and every results README a measured figure left unmarked
must be dated: its paragraph or section heading names its run (a tree commit, a date or the
run's folder; dated_prose.py).

    python3 tools/readme_numbers.py --check
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import dated_prose  # noqa: E402
from figures import FIGURES  # noqa: E402

# the files whose marked figures are checked: these, and every study's README.md
CITING = (
    "README.md",
    "docs/findings.md",
    "results/sm90/studies/workloads/COMMANDS.md",
    "results/sm90/studies/engine-kernels/COMMANDS.md",
)
STUDY_READMES = sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / "results").rglob("README.md")
    if p.relative_to(ROOT).parts[1] != "ci"  # .ci/run's own output
)
FILES = (*CITING, *STUDY_READMES)
MARK = re.compile(r"<!-- n:([a-z0-9_]+) -->(.*?)<!-- /n -->", re.S)

# the files whose every measured figure is marked or dated: the findings and the study READMEs
DATED = ("docs/findings.md", *STUDY_READMES)


def undated(root: Path = ROOT, files=DATED) -> list[str]:
    """One line per paragraph holding a measured figure that is neither marked (and so
    recomputed) nor dated to its run (tools/dated_prose.py)."""
    return dated_prose.undated(root, files, MARK)


def problems(root: Path = ROOT, files=FILES, figures=FIGURES) -> list[str]:
    """One line per marked figure whose text differs from its recomputed value."""
    found = []
    for name in files:
        text = (root / name).read_text()
        for m in MARK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            key, cited = m.group(1), m.group(2)
            if key not in figures:
                found.append(f"{name}:{line}: unknown figure {key!r}")
                continue
            value = figures[key]()
            if cited != value:
                found.append(f"{name}:{line}: {key} reads {cited!r}, the rows say {value!r}")
    return found


def write(root: Path = ROOT, files=FILES, figures=FIGURES) -> int:
    """Put every marked figure's recomputed value in; returns how many changed."""
    changed = 0
    for name in files:
        path = root / name
        text = path.read_text()

        def fill(m: re.Match) -> str:
            nonlocal changed
            key = m.group(1)
            value = figures[key]() if key in figures else m.group(2)
            changed += value != m.group(2)
            return f"<!-- n:{key} -->{value}<!-- /n -->"

        path.write_text(MARK.sub(fill, text))
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 on a stale figure")
    mode.add_argument("--write", action="store_true", help="put the recomputed values in")
    args = ap.parse_args(argv)
    if args.write:
        print(f"{write()} figures changed")
        return 0
    found = problems() + undated()
    print("\n".join(found) if found else "README numbers: every marked figure matches its rows")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
