"""vLLM's attention-benchmark configs (benchmarks/attention_benchmarks/configs/*.yaml in vLLM)
as suite scenarios: the sparse MLA backends mapped to this suite's, the model to the suite
model of the same dimensions, the head sweep, the batch specs (scenario key `batch_spec`,
cases/batch_spec.py) and the repeat counts carried over. The scenario text comes back; the
caller loads it like any other file."""

from __future__ import annotations

import json
from dataclasses import dataclass

from dsv4bench.cases import batch_spec
from dsv4bench.scenarios.read import plain_data

# vLLM backend name -> this suite's backend. FLASHINFER_MLA_SPARSE is FlashInfer's TRT-LLM
# kernel (sm100); on sm90 vLLM runs FLASHINFER_MLA_SPARSE_SM90, FlashInfer's FA3 MLA over
# top-k page indices, which the suite's `flashinfer` backend runs as well.
BACKENDS = {
    "FLASHMLA_SPARSE": "flashmla",
    "FLASHINFER_MLA_SPARSE": "flashinfer",
    "FLASHINFER_MLA_SPARSE_SM90": "flashinfer",
    "FLASH_ATTN_MLA_SPARSE": "fa3",
}
# The model dimensions that name a suite model: (head_dim, kv_lora_rank, qk_rope_head_dim).
MODELS = {(576, 512, 64): "v3.2"}
KEYS = ("model", "model_parameter_sweep", "batch_specs", "backends", "repeats", "warmup_iters")
IGNORED = ("device", "profile_memory")  # where and what else vLLM's script measures
SWEPT = {"num_q_heads": "num_heads"}


class ConfigError(ValueError):
    """A config the converter cannot carry over: one line naming the value."""


@dataclass(frozen=True)
class Conversion:
    name: str
    model: str
    backends: tuple[str, ...]
    specs: tuple[str, ...]
    heads: tuple[int, ...]  # the head sweep; one value when the config sweeps none
    warmup: int | None
    iters: int | None
    notes: tuple[str, ...]  # what was mapped or left out, for the header


def convert(text: str, *, source: str, name: str, arch: str = "sm90") -> str:
    """The scenario file for a vLLM config's text (`source` is its path, for the header)."""
    return render(read(text, name=name), source=source, arch=arch)


def read(text: str, *, name: str) -> Conversion:
    try:
        config = plain_data(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(config, dict):
        raise ConfigError("expected a mapping of config keys")
    for key in config:
        if key not in KEYS and key not in IGNORED:
            raise ConfigError(f"unsupported key {key!r}; the converter reads {', '.join(KEYS)}")
    model, model_note, base_heads = _model(config.get("model"))
    backends, backend_notes = _backends(config.get("backends"))
    specs = config.get("batch_specs")
    if not isinstance(specs, list) or not specs:
        raise ConfigError("batch_specs: expected a non-empty list of batch specs")
    for spec in specs:
        try:
            batch_spec.parse_segments(spec)
        except batch_spec.BatchSpecError as e:
            raise ConfigError(f"batch_specs: {e}") from None
    heads = _heads(config.get("model_parameter_sweep"), base_heads)
    left = [k for k in IGNORED if k in config]
    notes = [model_note, *backend_notes]
    if left:
        notes.append(f"not carried: {', '.join(left)}")
    return Conversion(
        name=name,
        model=model,
        backends=backends,
        specs=tuple(specs),
        heads=heads,
        warmup=_count(config, "warmup_iters", 0),
        iters=_count(config, "repeats", 1),
        notes=tuple(notes),
    )


def render(c: Conversion, *, source: str, arch: str) -> str:
    lines = [
        f"# Converted by `dsv4bench import vllm-bench` from vLLM's {source}.",
        *(f"# {note}" for note in c.notes),
        "# Each batch spec becomes the calls vLLM's sparse MLA backends make of it (its decode",
        "# part and prefill parts; docs/scenarios.md, vLLM batch specs).",
        f"name: {c.name}",
        f"description: vLLM attention benchmark {source}, with the oracle and crash isolation.",
        f"arch: [{arch}]",
        f"backends: [{', '.join(c.backends)}]",
        f"model: {c.model}",
    ]
    timing = {k: v for k, v in (("warmup", c.warmup), ("iters", c.iters)) if v is not None}
    if timing:
        lines.append("timing: {" + ", ".join(f"{k}: {v}" for k, v in timing.items()) + "}")
    heads = ", ".join(str(h) for h in c.heads)
    lines += ["sweep:", f"  num_heads: [{heads}]", "cases:", "  - batch_spec:"]
    lines += [f"      - {json.dumps(spec)}" for spec in c.specs]
    return "\n".join(lines) + "\n"


def _model(m) -> tuple[str, str, int]:
    if not isinstance(m, dict):
        raise ConfigError("model: expected a mapping (name, num_q_heads, head_dim, ...)")
    dims = tuple(m.get(k) for k in ("head_dim", "kv_lora_rank", "qk_rope_head_dim"))
    suite = MODELS.get(dims)
    if suite is None:
        known = "; ".join(f"{d[0]}/{d[1]}/{d[2]} ({n})" for d, n in MODELS.items())
        got = "/".join(str(d) for d in dims)
        raise ConfigError(
            f"model {m.get('name')!r}: head_dim/kv_lora_rank/qk_rope_head_dim {got} match no "
            f"suite model; known: {known}"
        )
    heads = m.get("num_q_heads", 128)
    if not _positive(heads):
        raise ConfigError(f"model.num_q_heads: expected a positive integer, got {heads!r}")
    note = (
        f"model {m.get('name')} (head_dim {dims[0]}, kv_lora_rank {dims[1]}) -> {suite}; "
        "its block_size is not carried (the suite's cache pages are the kernels' own)"
    )
    return suite, note, heads


def _backends(names) -> tuple[tuple[str, ...], list[str]]:
    if not isinstance(names, list) or not names:
        raise ConfigError("backends: expected a non-empty list of vLLM backend names")
    out: list[str] = []
    for name in names:
        if name not in BACKENDS:
            known = ", ".join(BACKENDS)
            raise ConfigError(f"backend {name!r} has no counterpart here; known: {known}")
        if BACKENDS[name] not in out:
            out.append(BACKENDS[name])
    mapped = ", ".join(f"{n} -> {BACKENDS[n]}" for n in names)
    return tuple(out), [f"backends: {mapped}"]


def _heads(sweep, base: int) -> tuple[int, ...]:
    if sweep is None:
        return (base,)
    if not isinstance(sweep, dict) or sweep.get("param_name") not in SWEPT:
        got = sweep.get("param_name") if isinstance(sweep, dict) else sweep
        raise ConfigError(
            f"model_parameter_sweep: param_name {got!r} is not carried; known: {', '.join(SWEPT)}"
        )
    values = sweep.get("values")
    if not isinstance(values, list) or not values or not all(_positive(v) for v in values):
        raise ConfigError(
            f"model_parameter_sweep.values: expected positive integers, got {values!r}"
        )
    return tuple(values)


def _count(config: dict, key: str, minimum: int) -> int | None:
    if key not in config:
        return None
    v = config[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ConfigError(f"{key}: expected an integer >= {minimum}, got {v!r}")
    return v


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
