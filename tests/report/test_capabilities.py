"""The capability table's declared columns: every registered backend declares each of them,
and what rows measured wins over what is declared, saying which it is."""

from __future__ import annotations

import inspect

import pytest

from dsv4bench import backends
from dsv4bench.report import capabilities
from tests.factories import V4, make_case

PROBE = make_case(V4, topk=128, window=128, compress_ratio=4, extra_topk=512, sink=True)


@pytest.mark.parametrize("name", backends.names())
def test_every_registered_backend_declares_every_column(name):
    backend = backends.get(name)
    declared = type(backend).capabilities
    cls = type(backend)
    where = f"{cls.__module__}.{cls.__qualname__}"
    for column in capabilities.DECLARED:
        assert column in declared, (
            f"backend {name!r} declares no {column!r}: add "
            f'"{column}": "<yes/no/...: why, from the adapter or kernel API>" to the class '
            f"attribute `capabilities` of {where} ({inspect.getsourcefile(cls)})"
        )
        assert declared[column].strip(), f"{where}.capabilities[{column!r}] is empty"
    unknown = set(declared) - set(capabilities.DECLARED)
    assert not unknown, f"{where}.capabilities has columns the table has not: {sorted(unknown)}"


def test_the_base_class_declares_nothing():
    # a new backend's missing declaration must fail above, not inherit someone else's
    assert backends.Backend.capabilities == {}


def _row(backend, **fields):
    return {"backend": backend, "status": "ok", "params": {}, **fields}


def test_measured_rows_win_over_declarations_and_say_so():
    rows = [
        _row("flashmla", timing={"graph_ms": 0.1}),
        # a graph-refill case its adapter refused: nothing was captured
        _row("flashmla", params={"graph_batch": 8}, status="unsupported"),
        _row("flashmla", accuracy={"batch_invariance": {"max_ulps": 0}, "lse_max_abs": 1e-6}),
        _row("fa3", params={"graph_batch": 8}, status="crash", message="CUDA error: illegal"),
        _row("fa3", accuracy={"batch_invariance": {"max_ulps": 3}, "lse_max_abs": None}),
    ]
    flashmla = capabilities.capability_row(backends.get("flashmla"), PROBE, "sm90", rows)
    assert flashmla["CUDA graphs"] == "yes: 1 rows captured and replayed (measured)"
    assert flashmla["batch invariance"] == "yes in 1 rows (measured)"
    assert flashmla["lse out"] == "yes: judged in 1 rows (measured)"
    fa3 = capabilities.capability_row(backends.get("fa3"), PROBE, "sm90", rows)
    assert fa3["CUDA graphs"].startswith("fails in 1 rows, e.g. CUDA error: illegal")
    assert fa3["batch invariance"] == "no: up to 3 ulps in 1 rows (measured)"
    assert fa3["lse out"].endswith("(declared)")  # no row judged an lse
    plain = capabilities.capability_row(backends.get("triton"), PROBE, "sm90")
    assert all(plain[c].endswith("(declared)") for c in capabilities.DECLARED)
