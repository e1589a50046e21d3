"""Options of the scenario benchmarks (benchmarks/conftest.py), registered here at the checkout's
root: pytest reads the root conftest before it parses the command line, so that
`pytest --benchmark-only --scenario FILE` (a space, as in the README) is an option with its value
and not a path that hides benchmarks/ from collection."""


def pytest_addoption(parser):
    group = parser.getgroup("dsv4bench")
    group.addoption(
        "--scenario",
        action="append",
        default=[],
        help="scenario YAML to benchmark (repeatable; default scenarios/smoke.yaml)",
    )
    group.addoption(
        "--bench-backend",
        action="append",
        default=[],
        help="run these backends on every case instead of the scenario's (repeatable)",
    )
    group.addoption("--plugin", action="append", default=[], help="backend plugin module")
    group.addoption(
        "--backend-opt",
        action="append",
        default=[],
        help="a backend's option NAME.OPTION=VALUE, e.g. flashmla.lib=PATH (repeatable)",
    )
    group.addoption("--flashmla-lib", default=None, help="same as --backend-opt flashmla.lib=PATH")
