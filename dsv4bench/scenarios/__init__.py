"""Scenario files: YAML -> validated Scenario -> Cases, or (`op: serving`) -> ServingSpec.
The schema is in docs/scenarios.md. The only package that touches YAML.

Everything is checked before anything runs; the first problem is raised as a ScenarioError
whose text is one line, `FILE:LINE: key.path: what was expected`. One module per step: read
(YAML tree with lines), rules (value checks, also validate_case), expand (kernel cases),
serving_entry (serving files, whose spec is serving_spec), entries (one file -> what it
holds); scenario holds the loaded Scenario and its LimitSearches. May import cases/ and
reference/; nothing that runs, models serving or reports.
"""

from dsv4bench.scenarios.entries import (
    discover,
    expand,
    is_serving_text,
    load_any,
    load_serving,
)
from dsv4bench.scenarios.expand import (
    MAX_CASES,
    TOP_KEYS,
    LimitSearch,
    Scenario,
    load,
    load_text,
)
from dsv4bench.scenarios.read import ScenarioError
from dsv4bench.scenarios.rules import (
    AXES,
    DEFAULT_CONTEXT_LEN,
    DEFAULT_PREFILL_TOKENS,
    LIMIT_AXES,
    validate_case,
)

__all__ = [
    "AXES",
    "DEFAULT_CONTEXT_LEN",
    "DEFAULT_PREFILL_TOKENS",
    "LIMIT_AXES",
    "MAX_CASES",
    "TOP_KEYS",
    "LimitSearch",
    "Scenario",
    "ScenarioError",
    "discover",
    "expand",
    "is_serving_text",
    "load",
    "load_any",
    "load_serving",
    "load_text",
    "validate_case",
]
