"""Result rows as typed records: one declaration per kind (case, limit, serving).

Rows travel as JSON lines (results.jsonl); `from_dict` reads any row this suite ever wrote
(missing fields take their defaults, unknown ones are kept in `extra`), `to_dict` writes one.
A row built in code is checked when it is constructed (and by every `dataclasses.replace`):
a row breaking its kind's invariants never exists; only `from_dict` takes stored rows as
they are.
A case row keeps the invariants of flashinfer-bench's traces: accuracy only when the kernel ran
and its output was compared (`ok`/`incorrect`), timing only when `ok`; and it carries the
tolerance and the V3.2 scale reading it was judged with, so a report never re-judges it with
other numbers.
"""

from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass, field, fields
from typing import Any, ClassVar

STATUSES = ("ok", "unsupported", "incorrect", "crash", "timeout", "oom", "error")
COMPARED = ("ok", "incorrect")  # the kernel ran and its output was compared with the oracle
# the oracle as a kernel (backend `torch`): its rows are reference rows, a timing baseline,
# never a candidate of a ranking or of a "relative to" panel
ORACLE_BACKENDS = ("torch",)


def is_oracle_row(row: dict) -> bool:
    """A case row of the oracle, or of an instance built on it (backend_base)."""
    return (row.get("backend_base") or row.get("backend")) in ORACLE_BACKENDS


class RowError(ValueError):
    """A row that breaks its kind's invariants (a bug in whoever built it)."""


@dataclass
class Row:
    kind: ClassVar[str] = ""
    extra: dict = field(default_factory=dict)  # fields of other versions, kept as they were
    validate: InitVar[bool] = True  # False only for a stored row read back (from_dict)

    def __post_init__(self, validate: bool = True) -> None:
        if validate:
            self.check()

    @classmethod
    def from_dict(cls, d: dict) -> Row:
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names and v is not None}
        extra = {k: v for k, v in d.items() if k not in names and k != "kind"}
        return cls(**known, extra=extra, validate=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        extra = d.pop("extra")
        return {"kind": self.kind, **extra, **d}

    def problems(self) -> list[str]:
        return []

    def check(self) -> None:
        """Raise RowError unless the kind's invariants hold."""
        bad = self.problems()
        if bad:
            raise RowError(f"{self.kind} row {getattr(self, 'case_id', '?')}: {'; '.join(bad)}")

    def checked(self) -> dict:
        """to_dict() after the invariants hold (raises RowError otherwise)."""
        self.check()
        return self.to_dict()


@dataclass
class CaseRow(Row):
    """One (case, backend) job."""

    kind: ClassVar[str] = "case"
    scenario: str | None = None
    case_id: str | None = None
    op: str | None = None
    params: dict = field(default_factory=dict)
    tags: list = field(default_factory=list)
    backend: str | None = None  # the instance name (e.g. "flashmla-0.33")
    backend_base: str | None = None  # the backend it was built from ("flashmla")
    backend_options: dict = field(default_factory=dict)  # that instance's options
    provider: dict | None = None
    status: str = "error"
    message: str = ""
    accuracy: dict | None = None  # metrics.accuracy: cos_diff, max_abs, lse_max_abs, ...
    tolerance: dict | None = None  # {cos_diff, lse_abs} the accuracy was judged against
    scale_reading: str | None = None  # how the kernel reads V3.2 fp32 scales (None: exactly)
    timing: dict | None = None  # median_ms, p10_ms, p90_ms, n, method, samples_ms, ...
    derived: dict | None = None  # the registered metrics (dsv4bench.measure.metrics.DERIVED)
    info: dict = field(default_factory=dict)
    env: dict | None = None
    input_fingerprint: str | None = None

    def __post_init__(self, validate: bool = True) -> None:
        if self.scale_reading is None:  # rows before the typed rows kept it in info
            self.scale_reading = self.info.get("v32_scale_reading")
        super().__post_init__(validate)

    @classmethod
    def of(cls, case, backend, **fields_) -> CaseRow:
        """The row of `case` (a Case) on `backend` (a Backend), with the given fields; checked.
        Duck-typed, so that rows import nothing from the suite."""
        identity = dict(
            scenario=case.scenario,
            case_id=case.case_id,
            op=case.op,
            params=case.params(),
            tags=list(case.tags),
            backend=backend.name,
            backend_base=backend.base,
            backend_options=backend.option_values(),
        )
        return cls(**{**identity, **fields_})

    def problems(self) -> list[str]:
        bad = []
        if self.status not in STATUSES:
            bad.append(f"unknown status {self.status!r}")
        if self.accuracy is not None and self.status not in COMPARED:
            bad.append(f"accuracy on a row with status {self.status}")
        if self.accuracy is not None and self.tolerance is None:
            bad.append("accuracy without the tolerance it was judged with")
        if (self.timing is not None or self.derived is not None) and self.status != "ok":
            bad.append(f"timing on a row with status {self.status}")
        return bad


@dataclass
class LimitRow(CaseRow):
    """A limit search: where `backend` starts failing along `axis`."""

    kind: ClassVar[str] = "limit"
    axis: str | None = None
    last_ok: int | None = None
    first_fail: int | None = None
    probes: dict = field(default_factory=dict)  # value -> status
    step: int = 1  # the search's resolution: first_fail - last_ok <= step

    def problems(self) -> list[str]:
        return [] if self.status in STATUSES else [f"unknown status {self.status!r}"]


@dataclass
class ServingRow(Row):
    """One TTFT or TPOT point: a sum of measured kernel times by one timer (dsv4bench.serving)."""

    kind: ClassVar[str] = "serving"
    scenario: str | None = None
    case_id: str | None = None
    curve_id: str | None = None
    model: str | None = None
    metric: str | None = None  # ttft | tpot
    backend: str | None = None
    route: str | None = None
    threshold: int | None = None
    dequant: str | None = None  # ttft: read | pool (None: no chunk dequantizes)
    c128_index: str | None = None  # tpot: none | step | layer
    prompt_len: int | None = None
    chunk_size: int | None = None
    batch_size: int | None = None
    context_len: int | None = None
    num_heads: int | None = None
    tp: int | None = None
    value_ms: float | None = None
    breakdown_ms: dict | None = None
    status: str | None = None
    message: str | None = None
    parts: list = field(default_factory=list)
    label: str | None = None
    env: dict | None = None
    # the timing key the parts' times are (rows.timers; older rows: its name); None: events
    timer: str | None = None
    # the same parts' events medians summed, beside value_ms (older rows: None)
    events_ms: float | None = None
    # the route's workspace beside the KV cache (serving.planning helper_bytes: the dequantized
    # bf16 rows and remapped indices of its largest one-layer call; 0 where the route reads the
    # cache as it is); older rows: None
    workspace_mib: float | None = None

    def __post_init__(self, validate: bool = True) -> None:
        if self.status is None:
            self.status = "ok" if self.value_ms is not None else "error"
        super().__post_init__(validate)

    def problems(self) -> list[str]:
        if (self.value_ms is not None) != (self.status == "ok"):
            return [f"value_ms {self.value_ms} on a {self.status} point"]
        if self.events_ms is not None and self.status != "ok":
            return [f"events_ms {self.events_ms} on a {self.status} point"]
        return []


KINDS: dict[str, type[Row]] = {k.kind: k for k in (CaseRow, LimitRow, ServingRow)}
# The row format this suite reads. A later version that changes what a field means writes
# `schema: N` (N > SCHEMA) in its rows; a row without one is of this format.
SCHEMA = 1
TIMES = ("median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "q1_ms", "q3_ms")


def stored_problems(d: object) -> list[str]:
    """Why a stored object is not a row this suite could have written (empty when it is one):
    a row names its case and backend (a serving point its metric), has a known status and holds
    only finite, non-negative times, each field of its declared type, and is of no newer
    format (SCHEMA). Looser than `checked()`, so that rows written before an invariant existed
    still load; a kind of a later version is taken as it is (see unknown_kinds)."""
    if not isinstance(d, dict):
        return [f"a JSON {type(d).__name__}, not a row"]
    schema = d.get("schema", SCHEMA)
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        return [f"schema {schema!r} is not a format number"]
    if schema > SCHEMA:  # its fields may mean other things: read as ours, numbers would lie
        return [f"row schema {schema} is newer than this dsv4bench reads ({SCHEMA}): update it"]
    kind = d.get("kind") or "case"
    if kind not in KINDS:
        return []
    need = ("metric",) if kind == "serving" else ("case_id", "backend")
    bad = [f"no {k}" for k in need if not isinstance(d.get(k), str) or not d.get(k)]
    bad += _type_problems(d, KINDS[kind])
    if kind != "serving" and d.get("status") not in STATUSES:
        bad.append(f"unknown status {d.get('status')!r}")
    timing = d.get("timing")
    times = {k: (timing or {}).get(k) for k in TIMES} if isinstance(timing, dict) else {}
    if kind == "serving":
        times = {"value_ms": d.get("value_ms"), "events_ms": d.get("events_ms")}
    for key, v in times.items():
        if v is not None and not _a_time(v):
            bad.append(f"{key} {v!r} is not a finite time >= 0")
    return bad


# a field's declared type (the annotations above, as text) -> what a stored value may be
_STORED = {"dict": (dict,), "list": (list,), "str": (str,), "int": (int,), "float": (int, float)}
_SAID = {"dict": "a mapping", "list": "a list", "str": "text", "int": "an integer"}


def _declared(cls: type[Row]) -> dict[str, tuple[str, ...]]:
    """Each field's declared types by name ("dict | None" -> ("dict",)); None is always
    taken (from_dict reads it as the field's default)."""
    return {
        f.name: tuple(t.strip() for t in str(f.type).split("|") if t.strip() != "None")
        for f in fields(cls)
        if f.name != "extra"
    }


def _type_problems(d: dict, cls: type[Row]) -> list[str]:
    """Fields holding a value of another type (`env` a string, `params` a list): a report
    reading them would fail far from the row."""
    bad = []
    for name, types in _declared(cls).items():
        v = d.get(name)
        if v is None or not types:
            continue
        allowed = tuple(t for n in types for t in _STORED.get(n, (object,)))
        if not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed):
            said = " or ".join(_SAID.get(n, f"a {n}") for n in types if n)
            bad.append(f"{name} {_shown(v)} is {_kind_of(v)}, expected {said}")
    return bad


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:39] + "…"


def _kind_of(v: object) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean"}.get(
        type(v), f"a {type(v).__name__}"
    )


def unknown_kinds(stored: list[dict]) -> dict[str, int]:
    """How many rows of each kind this suite does not know (a later version's): nothing reads
    them, so whoever loads them says so."""
    found: dict[str, int] = {}
    for d in stored:
        kind = str(d.get("kind") or "case")
        if kind not in KINDS:
            found[kind] = found.get(kind, 0) + 1
    return found


def _a_time(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")


def from_dict(d: dict) -> Any:
    """The typed record of any stored row (kind "case" when it has none)."""
    kind = d.get("kind") or "case"
    if kind not in KINDS:
        raise RowError(f"unknown row kind {kind!r}")
    return KINDS[kind].from_dict(d)
