"""The run history: an append-only folder of entries, one JSON file a run.

An entry is what a trend needs of one run, keyed by commit, kernel builds, device and date:
per (case, backend) its status, timing (median, p10, p90, n) and error (cos_diff, and why the
judge refused it), and per serving point its TTFT/TPOT value. Limit searches are left out (a
limit is not a time). `add` never rewrites a file: a run already there (same rows) is
reported and left; entries are read back sorted by date, then by file name.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from dsv4bench.report.compare_rules import accuracy_bad, sample_count, spread
from dsv4bench.report.load import family, is_probe, load_rows
from dsv4bench.rows.results import rows_file

ENTRY_SCHEMA = 2  # 2: a point keeps its fastest sample (min_ms)
ENTRIES = "entries"  # entries live in HISTORY/entries/ (runs/ is git-ignored)


class HistoryError(ValueError):
    """A history folder or an entry that cannot be read, or a run that gives no entry."""


@dataclass
class Point:
    """One (case, backend) of a run, or one serving point (metric ttft/tpot)."""

    key: str  # case_id · backend (serving: case_id b<batch> · backend)
    family: str  # what a trend plot groups: op/model/layout[/route], or metric/model
    backend: str
    status: str
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    n: int = 0
    cos_diff: float | None = None
    accuracy_bad: str | None = None  # why the run's own judge refused the answer
    min_ms: float | None = None  # the fastest timed call (schema 2; the paired gate's time)


@dataclass
class Entry:
    id: str
    date: str  # ISO 8601, UTC
    commit: str
    device: str  # the GPU model, or "cpu <machine>"
    host: str
    builds: dict[str, str]  # backend -> the kernel build its rows name (provider)
    scenarios: list[str]
    label: str = ""
    points: list[Point] = field(default_factory=list)
    schema: int = ENTRY_SCHEMA

    @property
    def build_key(self) -> str:
        text = json.dumps(self.builds, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Entry:
        points = [Point(**p) for p in d.get("points", [])]
        return cls(**{**d, "points": points})


def _device(env: dict) -> str:
    return env.get("gpu") or f"cpu {env.get('cpu') or '?'}"


def _most_common(values: list) -> str:
    found = Counter(str(v) for v in values if v)
    return found.most_common(1)[0][0] if found else "unknown"


def case_point(row: dict) -> Point:
    timing = row.get("timing") or {}
    lo, hi, _ = spread(timing) if row.get("status") == "ok" else (None, None, "")
    accuracy = row.get("accuracy") or {}
    return Point(
        key=f"{row.get('case_id')} · {row.get('backend')}",
        family=family(row),
        backend=str(row.get("backend")),
        status=str(row.get("status")),
        median_ms=timing.get("median_ms"),
        p10_ms=lo,
        p90_ms=hi,
        n=sample_count(timing) if timing else 0,
        cos_diff=accuracy.get("cos_diff"),
        accuracy_bad=accuracy_bad(row),
        min_ms=_fastest(timing) if row.get("status") == "ok" else None,
    )


def _fastest(timing: dict) -> float | None:
    samples = [s for s in timing.get("samples_ms") or [] if isinstance(s, (int, float))]
    return min(samples) if samples else timing.get("min_ms")


def serving_point(row: dict) -> Point:
    """A TTFT/TPOT point: a sum of measured medians, no spread of its own."""
    return Point(
        key=f"{row.get('case_id')} b{row.get('batch_size')} · {row.get('backend')}",
        family=f"{row.get('metric')}/{row.get('model')}/{row.get('route')}",
        backend=str(row.get("backend")),
        status=str(row.get("status")),
        median_ms=row.get("value_ms"),
    )


def entry_of(
    run_dir: Path, *, label: str = "", date: str | None = None, commit: str | None = None
) -> Entry:
    """The entry of a run directory (its rows as the report reads them)."""
    rows = load_rows(run_dir)
    cases = [r for r in rows if r.get("kind") == "case" and not is_probe(r)]
    serving = [r for r in rows if r.get("kind") == "serving"]
    if not cases and not serving:
        raise HistoryError(f"{run_dir}: holds no case or serving rows to keep in a history")
    envs = [r.get("env") or {} for r in cases + serving]
    builds: dict[str, str] = {}
    for r in cases:
        prov = r.get("provider") or {}
        builds.setdefault(
            str(r.get("backend")), f"{prov.get('name', '?')} {prov.get('version', '')}".strip()
        )
    # a resumed run may hold a key twice: its last row counts, as in compare
    keyed = {p.key: p for p in [case_point(r) for r in cases] + [serving_point(r) for r in serving]}
    points = sorted(keyed.values(), key=lambda p: p.key)
    when = date or _run_date(run_dir)
    entry = Entry(
        id="",
        date=when,
        commit=commit or _most_common([e.get("git_commit") for e in envs]),
        device=_most_common([_device(e) for e in envs]),
        host=_most_common([e.get("host") for e in envs]),
        builds=dict(sorted(builds.items())),
        scenarios=sorted({str(r.get("scenario")) for r in cases + serving}),
        label=label,
        points=points,
    )
    entry.id = _entry_id(entry)
    return entry


def _run_date(run_dir: Path) -> str:
    """When the run wrote its rows: the results file's modification time."""
    path = rows_file(run_dir) if run_dir.is_dir() else run_dir
    stamp = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    return stamp.replace(microsecond=0).isoformat()


def _entry_id(entry: Entry) -> str:
    """date, device, commit and a digest of what the entry holds: one name a run."""
    # min_ms (schema 2) left out: a run added before it was kept is "already there" after
    kept = [{k: v for k, v in asdict(p).items() if k != "min_ms"} for p in entry.points]
    body = json.dumps(kept, sort_keys=True)
    digest = hashlib.sha256(f"{entry.date}{entry.commit}{body}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", entry.device).strip("-").lower()
    day = entry.date[:10]
    commit = re.sub(r"[^A-Za-z0-9]+", "", entry.commit)[:12]
    return f"{day}_{slug}_{commit}_{digest}"


def add(history: Path, entry: Entry) -> tuple[Path, bool]:
    """Write the entry's file; (path, False) where that run is already in the history."""
    folder = Path(history) / ENTRIES
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{entry.id}.json"
    if path.exists():
        return path, False
    path.write_text(json.dumps(entry.to_dict(), indent=1, sort_keys=True) + "\n")
    return path, True


def entries(history: Path) -> list[Entry]:
    """Every entry of the history, oldest first (by date, then file name)."""
    folder = Path(history) / ENTRIES
    if not folder.is_dir():
        raise HistoryError(f"{history}: no history here (expected {folder}/ with entries)")
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            d = json.loads(path.read_text())
            entry = Entry.from_dict(d)
        except (ValueError, TypeError) as e:
            raise HistoryError(f"{path}: not a history entry ({e})") from None
        if entry.schema > ENTRY_SCHEMA:
            raise HistoryError(
                f"{path}: entry schema {entry.schema}, this suite reads {ENTRY_SCHEMA}"
            )
        found.append(entry)
    if not found:
        raise HistoryError(f"{folder}: holds no entries (dsv4bench history add RUN_DIR)")
    return sorted(found, key=lambda e: (e.date, e.id))
