"""docs/scenarios.md's "Shipped scenarios" table, made from scenarios/ itself: one row per
scenario file, its cases, jobs, backends and limit searches counted by the loader (what `plan`
counts). The `note` column is prose kept from the table as it is (a new file starts with its
scenario's description); it must hold no count the other columns give.

  python tools/scenario_table.py          # rewrite the table in place
  python tools/scenario_table.py --check  # exit 1 naming the first row that differs (CI, tests)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scenarios.md"
BEGIN = "<!-- scenario-table: tools/scenario_table.py writes the rows below -->"
END = "<!-- /scenario-table -->"
HEAD = (
    "| file | cases | jobs | backends | limit searches | note |",
    "|---|---|---|---|---|---|",
)


def counted(path: Path) -> tuple[str, str, str, str]:
    """(cases, jobs, backends, limit searches) of one scenario file, as the loader reads it."""
    from dsv4bench.commands.common import load

    jobs, limits, _ = load([str(path)], None)
    names = sorted({j.backend for j in jobs} | {lim.backend for lim in limits})
    cases = len({j.case.case_id for j in jobs})
    return str(cases), str(len(jobs)), ", ".join(names), str(len(limits))


def _description(path: Path) -> str:
    from dsv4bench.scenarios.read import plain_data

    data = plain_data(path.read_text())
    text = " ".join(str(data.get("description") or "").split()) if isinstance(data, dict) else ""
    return text.split(". ")[0].rstrip(".")


def rows(notes: dict[str, str]) -> list[str]:
    from dsv4bench import backends

    backends.setup([])
    out = []
    for path in sorted((ROOT / "scenarios").rglob("*.yaml")):
        name = path.relative_to(ROOT / "scenarios").as_posix()
        note = notes.get(name) or _description(path)
        cells = [f"`{name}`", *counted(path), note.replace("|", "\\|")]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _split(text: str) -> tuple[str, list[str], str]:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} block")
    before, rest = text.split(BEGIN, 1)
    table, after = rest.split(END, 1)
    return before, [line for line in table.strip().splitlines() if line.startswith("|")], after


def notes_of(table: list[str]) -> dict[str, str]:
    """file -> note of the rows of the table as it is."""
    notes = {}
    for line in table[len(HEAD) :]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == HEAD[0].count("|") - 1:
            notes[cells[0].strip("`")] = cells[-1].replace("\\|", "|")
    return notes


def made(text: str) -> tuple[list[str], list[str]]:
    """(the table as it is, the table as the scenarios make it)."""
    _, table, _ = _split(text)
    return table, [*HEAD, *rows(notes_of(table))]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    text = DOC.read_text()
    have, want = made(text)
    if "--check" in argv:
        for i, (a, b) in enumerate(zip(have + [""] * len(want), want, strict=False)):
            if a != b:
                print(f"{DOC}: shipped-scenarios row {i - 1}: is\n  {a}\nshould be\n  {b}")
                print("(python tools/scenario_table.py rewrites it)")
                return 1
        if len(have) != len(want):
            print(f"{DOC}: the table has {len(have) - len(want)} rows of no scenario file")
            return 1
        return 0
    before, _, after = _split(text)
    DOC.write_text(before + BEGIN + "\n" + "\n".join(want) + "\n" + END + after)
    print(f"{DOC}: {len(want) - len(HEAD)} scenario files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
