"""`kernels diff OLD NEW`: what changed between two builds of one library in what the adapters
read (surface.py), in one screen, and whether it changed by API or only by build."""

from __future__ import annotations

from pathlib import Path

from dsv4bench.kernels.store import Build
from dsv4bench.kernels.surface import Surface, first_difference, surface

SHOWN = 6  # lines per section before "(N more)"


def _section(title: str, old: dict[str, str], new: dict[str, str], detail: bool) -> list[str]:
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = sorted(k for k in set(old) & set(new) if old[k] != new[k])
    counts = f"{len(changed)} changed, {len(added)} added, {len(removed)} removed"
    if not (added or removed or changed):
        return [f"{title} ({len(new)}): same"]
    lines = [f"{title} ({len(old)} -> {len(new)}): {counts}"]
    items = [f"  changed {k}: " + (first_difference(old[k], new[k]) if detail else "sha256")
             for k in changed]  # fmt: skip
    items += [f"  added {k}{new[k] if detail else ''}" for k in added]
    items += [f"  removed {k}{old[k] if detail else ''}" for k in removed]
    lines += items[:SHOWN]
    if len(items) > SHOWN:
        lines.append(f"  ({len(items) - SHOWN} more)")
    return lines


def api_changed(old: Surface, new: Surface) -> bool:
    return old.ops != new.ops or old.functions != new.functions


def diff_lines(old_dir: Path, old: Build, new_dir: Path, new: Build) -> list[str]:
    """The screen of `kernels diff` for two builds of one library (folders and build.json)."""
    a, b = surface(old_dir, old), surface(new_dir, new)
    head = (
        f"{old.name} -> {new.name}: {new.library} {old.library_version} -> "
        f"{new.library_version} ({old.package}=={old.version} -> {new.package}=={new.version})"
    )
    lines = [head]
    lines += _section("op schemas", a.ops, b.ops, True)
    lines += _section("functions", a.functions, b.functions, True)
    lines += _section("kernel objects", a.objects, b.objects, False)
    if api_changed(a, b):
        verdict = "changed by API: the adapters' load checks decide (dsv4bench plan, then rows)"
    elif a.objects != b.objects:
        verdict = "changed by build only: same schemas and signatures, other kernel objects"
    else:
        verdict = "unchanged in what the adapters read"
    return [*lines, f"verdict: {verdict}"]
