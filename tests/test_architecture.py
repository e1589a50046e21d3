"""The shape of the tree: folders by stage, every import going down the stage order, small
modules and functions (Triton kernel sources included), no import circles, YAML read by the
scenario loader alone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dsv4bench"
MAX_LINES, MAX_FUNCTION, MAX_LONG_FUNCTIONS, MAX_LOOSE = 600, 80, 3, 8


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = {**_modules(PACKAGE), **_modules(ROOT / "reference")}

# The stages, bottom first: a module imports only from its own room (a folder of dsv4bench/,
# one of its top-level modules, or reference/) or from a room of a lower stage. Rooms of one
# stage are independent of each other.
STAGES = (
    ("dsv4bench", "reference"),  # the oracle; dsv4bench/__init__.py holds nothing
    ("rows", "kernels"),  # what a run leaves; the kernel builds engines ship
    ("cases",),  # one point of a sweep, its inputs and the oracle's answer
    ("measure",),  # timing, metrics, the judge
    ("scenarios", "backends", "env"),  # files -> cases; kernels; the machine
    ("serving",),  # the serving model over scenario specs
    ("run", "report"),  # running jobs; reading rows
    ("history",),  # runs over time: trends, the rolling gate, the trend page, v3 export
    ("interop",),  # runs in the peers' formats, their definitions as scenarios
    ("commands",),
    ("cli",),
)
STAGE = {room: level for level, rooms in enumerate(STAGES) for room in rooms}


def _imports(path: Path) -> set[str]:
    """Modules of this repository that `path` imports (at any depth of the file)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:  # `from pkg import mod` imports pkg.mod
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in MODULES else node.module)
    return out & set(MODULES)


def test_modules_and_functions_are_small():
    big = {}
    long = []
    for name, path in MODULES.items():
        if not name.startswith("dsv4bench"):
            continue
        text = path.read_text()
        if len(text.splitlines()) > MAX_LINES:
            big[name] = len(text.splitlines())
        functions = (
            n
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        )
        long += [f"{name}.{f.name}" for f in functions if f.end_lineno - f.lineno >= MAX_FUNCTION]
    assert not big, big
    assert len(long) <= MAX_LONG_FUNCTIONS, long
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(loose) <= MAX_LOOSE, loose


def test_no_import_circles():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            raise AssertionError("import circle: " + " -> ".join([*trail, name]))
        if name in done:
            return
        for dep in sorted(graph.get(name, ())):
            visit(dep, [*trail, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def room(module: str) -> str:
    """`backends` of dsv4bench.backends.flashinfer.sm90, `cli` of dsv4bench.cli, `reference`."""
    parts = module.split(".")
    return parts[0] if parts[0] == "reference" or len(parts) == 1 else parts[1]


def test_every_room_has_a_stage():
    assert {room(name) for name in MODULES} == set(STAGE)


def test_every_import_goes_down_the_stage_order():
    against = []
    for name, path in MODULES.items():
        for dep in _imports(path):
            here, there = room(name), room(dep)
            if here != there and STAGE[there] >= STAGE[here]:
                against.append(f"{name} -> {dep}")
    assert not against, against


def test_the_stage_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from dsv4bench.commands import run\n")
    assert _imports(module) == {"dsv4bench.commands.run"}


def test_the_oracle_imports_nothing_from_the_suite():
    for name, path in MODULES.items():
        if name.startswith("reference"):
            assert not {m for m in _imports(path) if m.startswith("dsv4bench")}, name


def test_only_the_scenario_loader_imports_yaml():
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(n == "yaml" or n.startswith("yaml.") for n in names):
                importers.add(path.relative_to(PACKAGE).as_posix())
    assert importers == {"scenarios/read.py"}


BACKENDS = "dsv4bench.backends"
TOOLCHAINS = f"{BACKENDS}.toolchains"
SHARED = (f"{BACKENDS}.base", f"{BACKENDS}.paged_rows")  # what every family may read
REGISTRATION = {BACKENDS, f"{BACKENDS}.registry", f"{BACKENDS}.builds"}  # they list families


def family(module: str) -> str | None:
    """The backend family of a module of dsv4bench/backends/ (`q8kv8` of its jit.py,
    `flashmla` of flashmla.py); None for the shared modules, the toolchains and registration."""
    if not module.startswith(BACKENDS + ".") or module in REGISTRATION or module in SHARED:
        return None
    name = module.split(".")[2]
    return None if name == "toolchains" else name


def test_a_family_imports_only_base_paged_rows_the_toolchains_and_itself():
    against = []
    for name, path in MODULES.items():
        own = family(name)
        if own is None:
            continue
        for dep in _imports(path):
            if not dep.startswith(BACKENDS) or dep in SHARED or family(dep) == own:
                continue
            if dep != TOOLCHAINS and not dep.startswith(TOOLCHAINS + "."):
                against.append(f"{name} -> {dep}")
    assert not against, against


def test_the_toolchains_import_only_base_and_kernels():
    against = []
    for name, path in MODULES.items():
        if name != TOOLCHAINS and not name.startswith(TOOLCHAINS + "."):
            continue
        for dep in _imports(path):
            if dep.startswith(TOOLCHAINS) or dep == f"{BACKENDS}.base":
                continue
            if room(dep) != "kernels":
                against.append(f"{name} -> {dep}")
    assert not against, against


def test_the_family_rule_sees_a_family_reaching_into_another():
    assert family("dsv4bench.backends.sgl_topk.backend") == "sgl_topk"
    assert family("dsv4bench.backends.q8kv8.jit") != family("dsv4bench.backends.sgl_topk.jit")
    assert family("dsv4bench.backends.toolchains.nvcc") is None
    assert family("dsv4bench.backends.flashmla") == "flashmla"
