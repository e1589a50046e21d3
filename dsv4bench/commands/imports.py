"""`dsv4bench import FORMAT ...`: other harnesses' files as suite scenarios. Each format is a
verb of its own module (import_vllm: vllm-bench), added here."""

from __future__ import annotations

import argparse

from dsv4bench.commands import import_vllm

HELP = "other harnesses' files as scenarios: vllm-bench"
FORMATS = (import_vllm,)  # each has add_parser(verbs) and sets its own func


def add_parser(sub) -> None:
    p = sub.add_parser("import", help=HELP, description=__doc__)
    verbs = p.add_subparsers(dest="format", required=True, parser_class=type(p))
    for module in FORMATS:
        module.add_parser(verbs)
    for parser in (p, *verbs.choices.values()):
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
