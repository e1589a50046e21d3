"""Which helper backends write a serving plan's KV-cache records (spec key cache_write).

Read from each backend's declarations (its ops, the layouts it takes, its own case rules),
never from its build: a plan made on a CPU without the engines' builds lists the same writer
jobs as one made on the GPU machine, and a missing build is that job's `unsupported` row."""

from __future__ import annotations

from collections.abc import Iterable

from dsv4bench.cases.case import Case


def why_not(name: str, case: Case) -> str | None:
    """Why backend `name` has no writer for a cache_write case's layout; None if it has one."""
    from dsv4bench import backends as registry  # only plans with cache_write load them

    try:
        backend = registry.get(name)
    except KeyError:
        return f"{name} is not a registered backend"
    if case.op not in backend.ops:
        return f"{name} has no {case.op} kernel (has: {', '.join(backend.ops)})"
    own = getattr(backend, "case_reason", None)  # the engine helpers' rules of a case
    return backend.layout_reason(case) or (own(case) if own else None)


def writer_backends(names: Iterable[str], case: Case) -> tuple[str, ...]:
    """The backends of `names` (in order, once each) that write `case`'s layout."""
    return tuple(n for n in dict.fromkeys(names) if why_not(n, case) is None)


def no_writer(names: Iterable[str], case: Case) -> str:
    """The line a serving row carries where no helper backend writes the layout."""
    names = list(dict.fromkeys(names))
    return (
        f"no cache writer part: none of helper_backends ({', '.join(names) or 'none'}) "
        f"writes a {case.layout} cache (cache_write)"
    )
