"""What a loaded scenario file is: a Scenario (its expanded Cases and the backends each runs
on) and its LimitSearches; plain data the runner and the command line read."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dsv4bench.cases.case import Case


@dataclass(frozen=True)
class LimitSearch:
    """Find where `backend` starts failing along `axis`: `lo` is expected to work, `hi` to fail.

    `base` is the point at `axis = lo`; every other field stays fixed during the search, which
    stops once the last working and first failing values are at most `step` apart. `probe`:
    values inside (lo, hi) probed before `hi` whatever the step (a size an engine issue
    reports: a failure there that hi does not share would fall between two probes); the first
    that fails is the bracket's failing end."""

    axis: str
    lo: int
    hi: int
    backend: str
    base: Case
    step: int = 1
    probe: tuple[int, ...] = ()

    def at(self, value: int) -> Case:
        return replace(self.base, **{self.axis: value})

    @property
    def limit_id(self) -> str:
        return f"limit-{self.axis}-{self.base.case_id}"


@dataclass
class Scenario:
    """A validated scenario file with its cases already expanded (in file order)."""

    name: str
    description: str
    op: str  # the top-level op; without one, the cases' op, or "mixed"
    arch: list[str]
    backends: list[str]  # the scenario's backends; a `cases` entry may replace them
    cases: list[Case]
    limits: list[LimitSearch]
    source: str
    tags: list[str] = field(default_factory=list)
    case_backends: dict[str, tuple[str, ...]] = field(default_factory=dict)  # case_id -> backends
    # backend instances the file defines ({name: flashmla, as: ..., OPTION: VALUE} entries):
    # [{"name", "base", "options", "origin"}], for backends.configure
    instances: list[dict] = field(default_factory=list)
    included: list[str] = field(default_factory=list)  # the files whose cases it runs (include)

    def backends_for(self, case: Case) -> tuple[str, ...]:
        """The backends this case runs on: its entry's `backends`, else the scenario's."""
        return self.case_backends.get(case.case_id, tuple(self.backends))

    def jobs(self) -> list[tuple[Case, str]]:
        """Every (case, backend) pair in order."""
        return [(c, b) for c in self.cases for b in self.backends_for(c)]
