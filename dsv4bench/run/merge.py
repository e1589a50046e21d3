"""`dsv4bench merge RUN_DIR... --out RUN_DIR`: shard run directories -> one run directory.

The merged results.jsonl holds every shard's rows (shard order); shards/<i>/ (for an unsharded
input shards/run-<n>/) keeps each shard's command.txt, logs, its environment blocks (env.json)
and where it came from. Merging refuses what would make a false comparison: a part with
unreadable lines, the same shard twice, shards of different splits, a job present in two inputs,
a missing shard (unless `partial`), and (unless `allow_mixed`) rows of different GPU models or
kernel builds.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from dsv4bench.rows import stored_problems
from dsv4bench.rows.results import RESULTS_FILE, read_rows

KEPT = ("command.txt", "run.log", RESULTS_FILE + ".torn")  # a shard's files kept as provenance
MERGED = "merged.json"


class MergeError(ValueError):
    """Inputs that cannot be merged (one line for the user, exit 2)."""


@dataclass
class Part:
    """One input run directory."""

    path: Path
    rows: list[dict]
    shard: str | None  # "I/N", or None for an unsharded run

    @property
    def index(self) -> int | None:
        return int(self.shard.split("/")[0]) if self.shard else None

    @property
    def count(self) -> int | None:
        return int(self.shard.split("/")[1]) if self.shard else None


def row_key(row: dict) -> tuple:
    """What a row is a result of: kind, case, backend; a limit probe is not the plain job."""
    probe = "limit-probe" in (row.get("tags") or [])
    return (row.get("kind") or "case", row.get("case_id"), row.get("backend"), probe)


def read_part(path: Path) -> Part:
    if not (path / RESULTS_FILE).is_file():
        raise MergeError(f"{path}: no {RESULTS_FILE} (not a run directory)")
    found = read_rows(path, quiet=True)
    if found.unreadable:
        lines = ", ".join(map(str, found.unreadable[:5])) + (
            ", ..." if len(found.unreadable) > 5 else ""
        )
        raise MergeError(
            f"{path / RESULTS_FILE}: {len(found.unreadable)} unreadable line(s) (line {lines}): "
            "their jobs would be lost; delete those lines and rerun that part with --resume"
        )
    for number, row in zip(found.lines, found, strict=True):
        problems = stored_problems(row)
        if problems:
            raise MergeError(f"{path / RESULTS_FILE}:{number}: not a result row: {problems[0]}")
    rows = list(found)
    shards = sorted({str(r["shard"]) for r in rows if r.get("shard")})
    if len(shards) > 1:
        raise MergeError(f"{path}: rows of several shards ({', '.join(shards)})")
    if shards and any(not r.get("shard") for r in rows):
        raise MergeError(f"{path}: rows of shard {shards[0]} and unsharded rows")
    return Part(path, rows, shards[0] if shards else None)


def check_parts(parts: list[Part], *, allow_mixed: bool = False) -> list[str]:
    """Raises MergeError for parts that cannot be merged; returns the shards missing (I/N)."""
    seen: dict[Path, Path] = {}
    for p in parts:
        real = p.path.resolve()
        if real in seen:
            raise MergeError(f"{p.path}: given twice")
        seen[real] = p.path
    by_shard: dict[str, Part] = {}
    for p in parts:
        if p.shard is None:
            continue
        if p.shard in by_shard:
            raise MergeError(f"{p.path} and {by_shard[p.shard].path} are both shard {p.shard}")
        by_shard[p.shard] = p
    counts = {p.count for p in parts if p.count}
    if len(counts) > 1:
        labels = ", ".join(f"{p.path}: {p.shard}" for p in parts if p.shard)
        raise MergeError(f"shards of different splits ({labels})")
    owner: dict[tuple, Part] = {}
    for p in parts:
        for key in dict.fromkeys(row_key(r) for r in p.rows):
            if key in owner:
                kind, case_id, backend, _ = key
                raise MergeError(
                    f"{kind} {case_id} {backend} is in both {owner[key].path} and {p.path}: "
                    "overlapping runs"
                )
            owner[key] = p
    if not allow_mixed:
        _check_same_setup(parts)
    if not counts:
        return []
    (count,) = counts
    return [f"{i}/{count}" for i in range(1, count + 1) if f"{i}/{count}" not in by_shard]


def _check_same_setup(parts: list[Part]) -> None:
    """One GPU model and one build per backend across the parts: else their rows are not one
    comparison."""
    gpus: dict[str, Path] = {}
    builds: dict[str, dict[tuple, Path]] = {}
    for p in parts:
        for r in p.rows:
            env = r.get("env") or {}
            gpus.setdefault(env.get("gpu") or env.get("arch") or "cpu", p.path)
            prov = r.get("provider")
            if isinstance(prov, dict) and prov.get("name"):
                build = (prov.get("name"), prov.get("version"))
                builds.setdefault(r.get("backend") or "?", {}).setdefault(build, p.path)
    if len(gpus) > 1:
        found = "; ".join(f"{g} in {path}" for g, path in gpus.items())
        raise MergeError(f"different GPU models ({found}); --allow-mixed merges them anyway")
    for backend, found in sorted(builds.items()):
        if len(found) > 1:
            which = "; ".join(f"{n} {v} in {path}" for (n, v), path in found.items())
            raise MergeError(
                f"{backend}: different kernel builds ({which}); --allow-mixed merges them anyway"
            )


def merge(
    paths: list[Path],
    out: Path,
    *,
    allow_mixed: bool = False,
    partial: bool = False,
    command: str = "",
) -> dict:
    """Write the merged run directory `out`; returns what merged.json records. A shard missing
    is refused unless `partial` (then merged.json lists it)."""
    parts = [read_part(Path(p)) for p in paths]
    missing = check_parts(parts, allow_mixed=allow_mixed)
    if missing and not partial:
        raise MergeError(
            f"shard(s) {', '.join(missing)} missing: the merged run would lack their jobs; "
            "name every shard's run directory, or --partial merges these anyway"
        )
    if (out / RESULTS_FILE).exists():
        raise MergeError(f"--out {out}: already holds results")
    if any(p.path.resolve() == out.resolve() for p in parts):
        raise MergeError(f"--out {out}: is one of the inputs")
    order = sorted(range(len(parts)), key=lambda i: (parts[i].index or 0, i))
    out.mkdir(parents=True, exist_ok=True)
    record = {"parts": [], "missing": missing, "allow_mixed": allow_mixed}
    with open(out / RESULTS_FILE, "w") as f:
        for n, i in enumerate(order, 1):
            part = parts[i]
            # shards keep their index; an unsharded run is `run-N`, so neither overwrites the other
            name = str(part.index) if part.index else f"run-{n}"
            for row in part.rows:
                f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
            _keep_provenance(part, out / "shards" / name)
            record["parts"].append(
                {
                    "dir": f"shards/{name}",
                    "source": str(part.path.resolve()),
                    "shard": part.shard,
                    "rows": len(part.rows),
                }
            )
    (out / MERGED).write_text(json.dumps(record, indent=2) + "\n")
    (out / "command.txt").write_text(command + "\n" if command else "")
    if missing:
        print(f"dsv4bench: merged without shard(s) {', '.join(missing)}", file=sys.stderr)
    return record


def _keep_provenance(part: Part, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (part.path / name).is_file():
            shutil.copy2(part.path / name, where / name)
    envs = {json.dumps(r["env"], sort_keys=True, default=str) for r in part.rows if r.get("env")}
    (where / "env.json").write_text(
        json.dumps([json.loads(e) for e in sorted(envs)], indent=2) + "\n"
    )
    (where / "source.txt").write_text(str(part.path.resolve()) + "\n")
