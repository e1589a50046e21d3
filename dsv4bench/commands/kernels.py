"""`dsv4bench kernels fetch|list|diff|pack|unpack`: the kernel builds engines ship, in the kernels
folder (default `.kernels`, $DSV4BENCH_KERNELS), one backend instance per build."""

from __future__ import annotations

import argparse
from pathlib import Path

from dsv4bench.commands.common import UsageError

HELP = "kernel builds from the engines' packages: fetch, list, diff, pack, unpack"


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help=HELP, description=__doc__)
    verbs = p.add_subparsers(dest="verb", required=True, parser_class=type(p))
    dir_help = "the kernels folder (default: $DSV4BENCH_KERNELS or .kernels)"
    f = verbs.add_parser(
        "fetch", help="download packages (pip, no dependencies) and cut out their builds"
    )
    f.add_argument(
        "spec",
        nargs="*",
        help="vllm==0.34.0 (any release), vllm (the newest the registry serves), all (every "
        "tested release; the default)",
    )
    f.add_argument("--dir", help=dir_help)
    f.add_argument("--wheels", metavar="DIR", help="take wheels from (and download into) DIR")
    f.add_argument("--python-version", default="3.12", help="of the GPU machine (default 3.12)")
    v = verbs.add_parser("list", help="the builds there and the backend instance each becomes")
    v.add_argument("--dir", help=dir_help)
    v = verbs.add_parser("diff", help="what changed between two builds, in what adapters read")
    v.add_argument("old", help="a build name (or a build's folder)")
    v.add_argument("new", help="a build name (or a build's folder) of the same library")
    v.add_argument("--dir", help=dir_help)
    v = verbs.add_parser("pack", help="one archive per build, for a machine without a registry")
    v.add_argument("build", nargs="*", help="build names (default: all)")
    v.add_argument("--dir", help=dir_help)
    v.add_argument("--out", default=".kpack", help="where archives go (default: .kpack)")
    v = verbs.add_parser("unpack", help="packed builds into the kernels folder, checked")
    v.add_argument("archive", nargs="*", help="archives or folders of them (default: .kpack)")
    v.add_argument("--dir", help=dir_help)
    for parser in (p, *verbs.choices.values()):
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_kernels)


def _root(args) -> Path:
    from dsv4bench.kernels.store import kernels_dir

    return Path(args.dir) if args.dir else kernels_dir()


def cmd_kernels(args) -> int:
    verbs = {"fetch": _fetch, "list": _list, "diff": _diff, "pack": _pack, "unpack": _unpack}
    return verbs[args.verb](args)


def _fetch(args) -> int:
    from dsv4bench.kernels import catalog
    from dsv4bench.kernels.fetch import FetchError, fetch_package

    try:
        wanted = [r for s in args.spec or catalog.default_specs() for r in catalog.parse_spec(s)]
    except catalog.SpecError as e:
        raise UsageError(f"kernels fetch {e}") from None
    root = _root(args)
    root.mkdir(parents=True, exist_ok=True)
    wheels = Path(args.wheels) if args.wheels else None
    for package, version in dict.fromkeys(wanted):
        try:
            fetch_package(package, version, root, wheels=wheels, python_version=args.python_version)
        except FetchError as e:
            raise UsageError(str(e)) from None
    print(f"kernels: {root} (dsv4bench kernels list)")
    return 0


def _list(args) -> int:
    from dsv4bench.backends import pinnable_libraries
    from dsv4bench.kernels.instances import default_builds
    from dsv4bench.kernels.store import scan, verify

    root = _root(args)
    builds, damaged = scan(root)
    for name, why in damaged:  # one line each: a build.json that does not read
        print(f"{name:28} damaged: {why} (dsv4bench kernels fetch again)")
    if not builds:
        if not damaged:
            print(f"no builds in {root} (dsv4bench kernels fetch, or kernels unpack)")
        return 0
    defaults = default_builds(builds)
    pinnable = pinnable_libraries()
    for b in builds:
        problems = verify(root, b)
        whole = "damaged: " + problems[0] if problems else "ok"
        default = f" (default {b.library})" if defaults.get(b.library) == b.name else ""
        role = "(a runtime, no backend)"
        if b.library in pinnable:
            role = f"-> backend {b.name}{default}"
        print(
            f"{b.name:28} {b.library} {b.library_version:12} from {b.package}=={b.version:12} "
            f"{b.size / 2**20:7.1f} MiB  {whole}  {role}"
        )
    return 0


def _build_at(root: Path, name: str):
    """(folder, build) of a build named `name` in `root`, or at the folder `name`."""
    import json

    from dsv4bench.kernels.store import BUILD_FILE, Build

    folder = Path(name) if (Path(name) / BUILD_FILE).is_file() else root / name
    try:
        return folder, Build.from_json(json.loads((folder / BUILD_FILE).read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        have = ", ".join(sorted(p.parent.name for p in root.glob(f"*/{BUILD_FILE}"))) or "none"
        raise UsageError(
            f"kernels diff: {name}: no build there (expected a build of {root}: {have})"
        ) from None


def _diff(args) -> int:
    from dsv4bench.kernels.diff import diff_lines

    root = _root(args)
    (old_dir, old), (new_dir, new) = _build_at(root, args.old), _build_at(root, args.new)
    if old.library != new.library:
        raise UsageError(
            f"kernels diff: {old.name} is {old.library}, {new.name} is {new.library} "
            "(expected two builds of one library)"
        )
    print("\n".join(diff_lines(old_dir, old, new_dir, new)))
    return 0


def _pack(args) -> int:
    from dsv4bench.kernels.pack import PackError, pack

    try:
        made = pack(_root(args), args.build, Path(args.out))
    except PackError as e:
        raise UsageError(f"kernels pack: {e}") from None
    for archive in made:
        print(f"{archive}  {archive.stat().st_size / 2**20:.1f} MiB")
    return 0


def _unpack(args) -> int:
    from dsv4bench.kernels.pack import PackError, archives, unpack

    found = archives([Path(a) for a in args.archive or [".kpack"]])
    missing = [a for a in found if not a.is_file()]
    if not found or missing:
        where = missing[0] if missing else ", ".join(args.archive or [".kpack"])
        raise UsageError(f"kernels unpack: no packed build at {where} (expected <build>.tar.xz)")
    root = _root(args)
    root.mkdir(parents=True, exist_ok=True)
    for archive in found:
        try:
            build, fresh = unpack(archive, root)
        except PackError as e:
            raise UsageError(f"kernels unpack: {e}") from None
        print(f"{build.name}: {'unpacked' if fresh else 'already there'} in {root}")
    return 0
