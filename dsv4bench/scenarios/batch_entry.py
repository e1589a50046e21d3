"""Scenario files: the `batch_spec` key (vLLM's grammar, cases/batch_spec.py): its parser, and
a point holding one turned into the points of the calls vLLM makes of that batch
(cases/batch_parts.py), each resolved as an ordinary case."""

from __future__ import annotations

from typing import Any

from dsv4bench.cases import batch_parts, batch_spec, lengths
from dsv4bench.scenarios.read import Node, Origin

# What a batch spec decides for each of its parts: an entry that also sets one is refused.
SETS = ("op", "batch_size", "s_q", "tokens", "context_len", "context_lens")

Point = dict[str, tuple[Any, Origin]]


def parse_value(p, n: Node) -> str:
    """A spec string, checked against the grammar (the bad token named at its line)."""
    text = p.text(n)
    try:
        batch_spec.parse_segments(text)
    except batch_spec.BatchSpecError as e:
        raise p.fail(n, str(e)) from None
    return text


def heads_per_rank(point: Point) -> int:
    """The heads that set vLLM's decode threshold: num_heads, else the model's over tp."""
    model = point["model"][0]
    if "num_heads" in point:
        return point["num_heads"][0]
    tp = point["tp"][0] if "tp" in point else 1
    return model.num_heads // tp if model.num_heads % tp == 0 else model.num_heads


def expand(p, point: Point) -> list[tuple[Point, list[str]]]:
    """The point itself (no batch_spec), or one point per part of its batch, each with the
    tags that say where it came from."""
    if "batch_spec" not in point:
        return [(point, [])]
    spec, at = point["batch_spec"]
    for key in SETS:
        if key in point:
            message = f"batch_spec {spec!r} (line {at.line}) sets {key}; leave {key} unset"
            raise p.fail(point[key][1], message)
    rest = {k: v for k, v in point.items() if k not in ("batch_spec", "route")}
    if "model" not in point:  # resolve names what is missing
        return [({**rest, "op": ("decode", at)}, [])]
    route = point["route"][0] if "route" in point else None
    parts = batch_parts.split(batch_spec.parse(spec), heads_per_rank(point), route)
    out = []
    for part in parts:
        values = part.fields()
        if "context_lens" in values:
            values["context_lens"] = lengths.explicit(list(values["context_lens"]))
        tags = [f"batch-spec:{spec}", f"vllm-{part.role}"]
        out.append(({**rest, **{k: (v, at) for k, v in values.items()}}, tags))
    return out
