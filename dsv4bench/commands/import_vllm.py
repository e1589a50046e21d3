"""`dsv4bench import vllm-bench CONFIG.yaml --out SCENARIO.yaml`: one of vLLM's attention
benchmark configs (benchmarks/attention_benchmarks/configs/) as a suite scenario
(interop/vllm/config.py), checked by loading it before it is written."""

from __future__ import annotations

import sys
from pathlib import Path

from dsv4bench.cases.case import ARCHS
from dsv4bench.commands.common import UsageError, check_out_file


def add_parser(verbs) -> None:
    v = verbs.add_parser(
        "vllm-bench", help="a vLLM attention-benchmark config (sparse MLA backends) as a scenario"
    )
    v.add_argument("config", help="e.g. benchmarks/attention_benchmarks/configs/X.yaml")
    v.add_argument("--out", metavar="SCENARIO.yaml", help="where to write (default: stdout)")
    v.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    v.add_argument("--name", help="the scenario's name (default: vllm-<config file name>)")
    v.add_argument("--arch", default="sm90", choices=ARCHS, help="its arch (default: sm90)")
    v.add_argument(
        "--source", help="the config's path to name in the header (default: the path given)"
    )
    v.set_defaults(func=cmd_import_vllm)


def cmd_import_vllm(args) -> int:
    from dsv4bench import backends, scenarios
    from dsv4bench.interop.vllm.config import ConfigError, convert

    path = Path(args.config)
    if not path.is_file():
        raise UsageError(f"{path}: no such config file")
    check_out_file(args.out, [path], args.force)
    name = args.name or f"vllm-{path.stem}"
    try:
        config = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{path}: not UTF-8 text (byte {e.start}); expected a YAML config"
        ) from None
    try:
        text = convert(config, source=args.source or str(path), name=name, arch=args.arch)
    except ConfigError as e:
        raise UsageError(f"{path}: {e}") from None
    backends.setup([])
    try:  # what is written must load as it is
        scenarios.load_text(text, args.out or "<converted>", known_backends=backends.catalog())
    except scenarios.ScenarioError as e:
        raise UsageError(str(e)) from None
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
