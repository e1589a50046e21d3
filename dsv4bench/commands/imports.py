"""`dsv4bench import FORMAT ...`: other harnesses' files as suite scenarios. Each format is a
verb of its own module (import_vllm: vllm-bench; interop: flashinfer-bench), added here."""

from __future__ import annotations

import argparse

from dsv4bench.commands import import_vllm, interop

HELP = "other harnesses' files as scenarios: vllm-bench, flashinfer-bench"
# each adds its verb to the group and sets its own func
FORMATS = (import_vllm.add_parser, interop.add_import_parser)


def add_parser(sub) -> None:
    p = sub.add_parser("import", help=HELP, description=__doc__)
    verbs = p.add_subparsers(dest="format", required=True, parser_class=type(p))
    for add in FORMATS:
        add(verbs)
    for parser in (p, *verbs.choices.values()):
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
