"""Scenario files, step 1: YAML text -> a tree of Nodes that remember their line and key path.

Only safe tags, no Python objects, no merge keys, no duplicate keys; every later error names
`FILE:LINE: key.path` from these nodes.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_NODES = 200_000  # YAML aliases can make a small file a huge tree
MAX_DEPTH = 64  # a scenario nests a few levels; Python's stack runs out some hundreds deep


class ScenarioError(ValueError):
    """A bad scenario: `str(e)` is one line, `FILE:LINE: key.path: what was expected`."""

    def __init__(self, file: str, line: int, path: str, message: str):
        self.file, self.line, self.path = file, line, path or "(top)"
        self.message = " ".join(str(message).split())
        super().__init__(f"{file}:{line}: {self.path}: {self.message}")


# ---- located YAML tree ---------------------------------------------------------------------

YAML_TAG = "tag:yaml.org,2002:"
SCALAR_TAGS = {YAML_TAG + t for t in ("str", "int", "float", "bool", "null")}


@dataclass
class Node:
    kind: str  # "map" | "seq" | "scalar"
    value: Any  # dict[str, Node] | list[Node] | a Python scalar
    line: int
    path: str
    plain: bool = False  # an unquoted, untagged scalar
    key_lines: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Origin:
    """Where a value came from: its line and key path, and how specific the place is."""

    line: int
    path: str
    rank: int  # 1 top level, 2 defaults, 3 sweep / case / limit entry, 4 limit lo / hi


def key_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def short_tag(tag: str) -> str:
    return "!!" + tag[len(YAML_TAG) :] if tag.startswith(YAML_TAG) else tag


def show_value(n: Node) -> str:
    """A value as the user wrote it, for `got ...`."""
    if n.kind == "map":
        return "a mapping"
    if n.kind == "seq":
        return "a list"
    v = n.value
    if v is None:
        return "null (an empty value)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return repr(v)
    return str(v)


def plain_data(text: str) -> Any:
    """Another harness's YAML as plain data (no lines kept): a YAML error is a ValueError of
    its first line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML: {str(e).splitlines()[0]}") from None


def suggestion(word: str, known: Collection[str]) -> str:
    known = list(known)
    close = difflib.get_close_matches(word, known, n=len(known) or 1, cutoff=0.6)
    if close:  # of equally close names, the one declared first (batch_size before batch_spec)
        score = lambda k: difflib.SequenceMatcher(None, k, word).ratio()  # noqa: E731
        best = max(close, key=lambda k: (score(k), -known.index(k)))
        return f"; did you mean {best}?"
    return f"; expected one of: {', '.join(known)}"


class Reader:
    """Turns composed YAML nodes into _Nodes, checking tags and duplicate keys."""

    def __init__(self, file: str):
        self.file = file
        self.count = 0
        self.scalars = yaml.constructor.SafeConstructor()

    def fail(self, line: int, path: str, message: str) -> ScenarioError:
        return ScenarioError(self.file, line, path, message)

    def read(self, node: yaml.Node, path: str) -> Node:
        self.count += 1
        line = node.start_mark.line + 1
        if self.count > MAX_NODES:
            raise self.fail(line, path, f"more than {MAX_NODES} YAML nodes (aliases?)")
        if node.tag.startswith(YAML_TAG + "python/"):
            raise self.fail(line, path, f"Python tags are not allowed, got {short_tag(node.tag)}")
        if isinstance(node, yaml.ScalarNode):
            if node.tag not in SCALAR_TAGS:
                raise self.fail(line, path, f"unsupported YAML tag {short_tag(node.tag)}")
            make = getattr(self.scalars, "construct_yaml_" + node.tag[len(YAML_TAG) :])
            plain = node.style is None and node.tag == YAML_TAG + "str"
            return Node("scalar", make(node), line, path, plain=plain)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != YAML_TAG + "seq":
                raise self.fail(line, path, f"unsupported YAML tag {short_tag(node.tag)}")
            items = [self.read(item, key_path(path, i)) for i, item in enumerate(node.value)]
            return Node("seq", items, line, path)
        if node.tag != YAML_TAG + "map":
            raise self.fail(line, path, f"unsupported YAML tag {short_tag(node.tag)}")
        out = Node("map", {}, line, path)
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == YAML_TAG + "merge":
                raise self.fail(
                    key_line, path, "YAML merge keys (<<) are not supported; use defaults"
                )
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != YAML_TAG + "str":
                key = self.read(key_node, path)
                raise self.fail(key_line, path, f"expected a text key, got {show_value(key)}")
            key = key_node.value
            if key in out.value:
                raise self.fail(
                    key_line,
                    key_path(path, key),
                    f"duplicate key (first given at line {out.key_lines[key]})",
                )
            out.key_lines[key] = key_line
            out.value[key] = self.read(value_node, key_path(path, key))
        return out


def parse(text: str, filename: str) -> Node:
    """The YAML text as a tree of Nodes with lines; YAML errors as ScenarioErrors."""
    try:
        return _parse(text, filename)
    except RecursionError:  # composing is recursive: find the place without recursing
        line = _too_deep(text) or 1
        message = f"nested more than {MAX_DEPTH} levels deep (a scenario nests a few)"
        raise ScenarioError(filename, line, "(yaml)", message) from None


def _too_deep(text: str) -> int | None:
    """The line where the YAML first nests deeper than MAX_DEPTH, if it does (the parser's
    events come one by one, so this needs no deep stack)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                return event.start_mark.line + 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return None


def _parse(text: str, filename: str) -> Node:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise ScenarioError(filename, line, "(yaml)", f"invalid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(filename, 1, "(yaml)", f"invalid YAML: {e}") from None
    if node is None:
        message = "expected a mapping of scenario keys, got an empty file"
        raise ScenarioError(filename, 1, "(top)", message)
    return Reader(filename).read(node, "")


def read_text(path: str | Path) -> str:
    """A scenario file's text; an unreadable file as a ScenarioError."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ScenarioError(str(path), 1, "(file)", f"cannot read: {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        why = f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        raise ScenarioError(str(path), line, "(file)", why) from None


def dump(data: dict) -> str:
    """A scenario's data as YAML text, keys in the order given (what `import` writes)."""
    return yaml.safe_dump(data, sort_keys=False)
