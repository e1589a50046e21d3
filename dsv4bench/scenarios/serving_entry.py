"""Scenario files, the second kind of entry: a file whose top level says `op: serving`.

Read by the same reader as kernel scenarios (read.parse: lines, no duplicate keys, safe tags)
and checked with the same value parsers (rules.Parser: timing, tolerance, head_padding); the
serving keys' own rules live with ServingSpec (serving_spec.py, which never sees YAML). Every
error is one line, `FILE:LINE: key: what was expected`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from dsv4bench.scenarios.read import Node, ScenarioError
from dsv4bench.scenarios.rules import Parser
from dsv4bench.scenarios.serving_spec import KEYS, ServingSpec, spec_from_dict
from dsv4bench.scenarios.workloads import context_lens

FILE_KEYS = ("name", "description", *KEYS)  # `name` is ServingSpec.scenario


def is_serving(root: Node) -> bool:
    """Whether a parsed file is an `op: serving` entry."""
    op = root.value.get("op") if root.kind == "map" else None
    return op is not None and op.kind == "scalar" and op.value == "serving"


def plain(n: Node) -> Any:
    """A node as plain Python data (mappings, lists, scalars)."""
    if n.kind == "map":
        return {k: plain(v) for k, v in n.value.items()}
    if n.kind == "seq":
        return [plain(v) for v in n.value]
    return n.value


class ServingLoader(Parser):
    def spec(self, root: Node) -> ServingSpec:
        """The ServingSpec of a parsed `op: serving` file."""
        m = self.expect_map(root, "a mapping of serving keys")
        data: dict[str, Any] = {}
        for key, n in m.items():  # in file order: the first error is the first line's
            self.known_key(root, key, FILE_KEYS)
            if key == "description":
                if n.kind != "scalar" or not isinstance(n.value, str):
                    raise self.fail(n, "expected a string")
            elif key == "timing":
                data["timing"] = self.timing(n)
            elif key == "tolerance":
                data["tolerance"] = self.tolerance(n)
            elif key == "head_padding":
                data["head_padding"] = self.head_padding(n)
            elif key == "ragged":
                if n.kind != "seq" or not n.value:
                    raise self.fail(n, "expected a non-empty list of context_lens mappings")
                data["ragged"] = [context_lens(self, item) for item in n.value]
            elif key in ("backends", "helper_backends") and n.kind == "seq":
                # names, or instance entries {name: BASE, as: NAME, OPTION: VALUE} as in kernel
                # scenarios (rules.Parser.backends)
                data[key] = self.backends(n) if n.value else []
            else:
                data["scenario" if key == "name" else key] = plain(n)
        try:
            spec = spec_from_dict(data)
            for b in (*spec.backends, *spec.helper_backends):
                if b not in self.known_backends and b not in self.instances:
                    raise ValueError(f"backends: unknown backend {b!r}")
        except ValueError as e:
            key, _, message = str(e).partition(": ")
            key = "name" if key == "scenario" else key
            raise ScenarioError(self.file, root.key_lines.get(key, 1), key, message) from None
        defined = [e for e in self.instances.values() if e["name"] != e["base"]]
        return replace(spec, instances=defined)


def serving_spec(root: Node, filename: str, known_backends: Collection[str]) -> ServingSpec:
    return ServingLoader(filename, known_backends).spec(root)
