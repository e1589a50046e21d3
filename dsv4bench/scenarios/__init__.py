"""Scenario files: YAML -> validated Scenario -> Cases. The schema is in docs/scenarios.md.

Everything is checked before anything runs; the first problem is raised as a ScenarioError
whose text is one line, `FILE:LINE: key.path: what was expected`. Three steps, one module
each: read (YAML tree with lines), rules (value checks, also validate_case), expand.
"""

from dsv4bench.scenarios.expand import (
    MAX_CASES,
    TOP_KEYS,
    LimitSearch,
    Scenario,
    discover,
    expand,
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
    "load",
    "load_text",
    "validate_case",
]
