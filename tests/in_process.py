"""The command line inside the test process (tests/conftest.py's run_cli fixture uses it)."""

from __future__ import annotations


def main_in_process(*args) -> int:
    """`dsv4bench ARGS` in this process (no interpreter start: torch alone takes seconds to
    import). The isolation under test stays: the runner's workers are processes of their own and
    load --plugin modules themselves. Each call starts from the shipped backends, as a new
    process does; backends a plugin registers here, and its module, are forgotten afterwards
    (and imported afresh by the next call), so no call sees another's."""
    import signal
    import sys

    from dsv4bench import backends
    from dsv4bench import cli as dsv4cli

    def plugin_modules() -> dict:
        return {m: mod for m, mod in sys.modules.items() if m.startswith("tests.plugins.")}

    argv = [str(a) for a in args]
    backends.names()  # the shipped backends, loaded once: what every call starts from
    registry = dict(backends._REGISTRY)  # private state: restored below
    configured = dict(backends._CONFIGURED)
    modules = plugin_modules()
    for name in modules:  # a plugin registers on import: import it afresh
        del sys.modules[name]
    # as a fresh process starts: the shipped backends only, no instances built
    shipped = {n: b for n, b in registry.items() if type(b).__module__.startswith("dsv4bench.")}
    backends._REGISTRY.clear()
    backends._REGISTRY.update(shipped)
    backends._CONFIGURED.clear()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGPIPE)}
    saved_argv = sys.argv
    sys.argv = ["dsv4bench", *argv]  # command.txt records it
    try:
        return dsv4cli.main(argv)
    finally:
        sys.argv = saved_argv
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        backends._REGISTRY.clear()
        backends._REGISTRY.update(registry)
        backends._CONFIGURED.clear()
        backends._CONFIGURED.update(configured)
        for name in plugin_modules():
            del sys.modules[name]
        sys.modules.update(modules)
