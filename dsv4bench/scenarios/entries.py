"""Scenario files, the entry point: one file, read and parsed once, is a kernel Scenario or a
serving entry (`op: serving`), each checked by its own loader with the same FILE:LINE errors."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from dsv4bench.cases.case import Case
from dsv4bench.scenarios.expand import ScenarioLoader
from dsv4bench.scenarios.read import ScenarioError, parse, read_text
from dsv4bench.scenarios.scenario import Scenario
from dsv4bench.scenarios.serving_entry import is_serving, serving_spec
from dsv4bench.scenarios.serving_spec import ServingSpec


def load_any(path: str | Path, *, known_backends: Collection[str]) -> Scenario | ServingSpec:
    """A scenario file as what it holds: a Scenario (kernel cases) or a ServingSpec."""
    root = parse(read_text(path), str(path))
    if is_serving(root):
        return serving_spec(root, str(path), known_backends)
    return ScenarioLoader(str(path), known_backends).scenario(root)


def load_serving(path: str | Path, *, known_backends: Collection[str]) -> ServingSpec:
    """The ServingSpec of an `op: serving` file; any other file is a ScenarioError."""
    entry = load_any(path, known_backends=known_backends)
    if not isinstance(entry, ServingSpec):
        raise ScenarioError(str(path), 1, "op", "expected a serving file (op: serving)")
    return entry


def is_serving_text(text: str, filename: str = "<string>") -> bool:
    """Whether scenario text is a serving entry (a YAML error raises its ScenarioError)."""
    return is_serving(parse(text, filename))


def expand(scenario: Scenario) -> list[Case]:
    """The scenario's cases in order (expansion and validation already happened in load)."""
    return list(scenario.cases)


def discover(root: str | Path) -> list[Path]:
    """Scenario files under a directory (recursively), sorted; a file is returned as is."""
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())
