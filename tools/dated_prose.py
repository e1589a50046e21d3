"""Prose whose figures are not recomputed must say which run they came from: a paragraph (or
list item, a table joined to the paragraph before it) holding a measured figure outside a
`<!-- n:NAME -->` marker names its run, in itself or in its section's heading. tools/
readme_numbers.py --check runs it over the findings and the study READMEs."""

from __future__ import annotations

import re
from pathlib import Path

# A measured figure in prose: a number with a unit of time, a ratio (x), a percentage, a
# scientific-notation error or a decimal range.
MEASURED = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?(?:\s?(?:ms|us|µs|GB/s|TB/s|TFLOP/s)\b|x\b|\s?%)"
    r"|(?<![\w.])\d+(?:\.\d+)?e-\d+\b|(?<![\w.])\d+\.\d+(?:\.\.|-)\d+\.\d+\b"
)
# What dates a paragraph to the run its figures came from: a tree commit, a date, or the run's
# folder (`results/...`, `studies/...`, a run folder of the study, `run/`)
RUN_NAMED = re.compile(
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b|\b20\d\d-\d\d-\d\d\b"
    r"|`[^`\n]*(?:studies/|results/|baseline-h)[^`\n]*`|`[\w.-]+/`"
)


def blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph or list item, a table joined to the paragraph
    before it; code blocks left out."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        starts = re.match(r"\s*(?:[-*] |\d+\. |#)", line) or not out or not line.strip()
        table = line.lstrip().startswith("|")
        if table and len(out) > 1 and not out[-1][1]:  # a table after a blank line
            out.pop()
        if fenced or not line.strip():
            out.append((number + 1, ""))
        elif starts and not table:
            out.append((number, line))
        else:
            first, said = out[-1]
            out[-1] = (first, f"{said}\n{line}")
    return [(n, b) for n, b in out if b.strip()]


def undated(root: Path, files, marked: re.Pattern) -> list[str]:
    """One line per paragraph holding a measured figure that is neither marked (and so
    recomputed) nor dated to its run, in the paragraph or its section's heading."""
    found = []
    for name in files:
        heading = ""  # a section's heading dates every paragraph under it
        for line, block in blocks(marked.sub("", (root / name).read_text())):
            if block.lstrip().startswith("#"):
                heading = block
            figure = MEASURED.search(block)
            if figure and not RUN_NAMED.search(f"{heading}\n{block}"):
                found.append(
                    f"{name}:{line}: {figure.group(0)!r} is neither marked nor dated: name its "
                    "run (a tree commit, a date or the run's folder) in the paragraph"
                )
    return found
