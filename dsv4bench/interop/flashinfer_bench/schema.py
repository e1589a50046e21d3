"""A Case as a flashinfer-bench Definition: one definition per combination of the constant
fields (model, layout, heads, dims, top-k widths, page size, window, compression, sink, route)
and of the call's form (a ragged batch, an indexer chunk), the rest (batch, query tokens,
context, cache pages) variable axes of its workloads.

Their data model (flashinfer_bench/data/definition.py, 0.1.2): axes {name: const value | var},
inputs and outputs {name: shape of axis names, dtype}, a Python `reference` defining `run`.
Their dtypes have no uint8: an FP8 cache goes as int8 records of its byte width (the same
bytes), its page stride in bytes stated as a constant axis (a V4 page is padded past
page_size * 584 bytes: docs/kernel-facts.md, V4 cache layout)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import torch

from dsv4bench.cases.case import SPLIT_PAGE, Case

OP_TYPE = "dsv4bench_sparse_mla"  # their op_type: the folder definitions, workloads, traces sit in
# Case fields that vary inside one definition (its workloads' axes); every other field is fixed.
VARYING = ("batch_size", "s_q", "tokens", "context_len", "context_lens", "ragged", "seed")
VARYING += ("index_pattern",)

DTYPES = {
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.int8: "int8",
    torch.uint8: "int8",  # FP8 records: the same bytes, read as int8
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.bool: "bool",
}

# Axis names of each input's dimensions, by the call's family (family()). A dimension without
# a name here is `<input>_dim<i>`, a variable axis.
_DECODE = {
    "q": ("batch_size", "s_q", "num_qo_heads", "head_dim_qk"),
    "k_cache": ("num_pages", "page_size", "num_kv_heads", "record_bytes"),
    "indices": ("batch_size", "s_q", "topk"),
    "extra_k_cache": ("num_extra_pages", "page_size", "num_kv_heads", "record_bytes"),
    "extra_indices": ("batch_size", "s_q", "extra_topk"),
    "attn_sink": ("num_qo_heads",),
    "topk_length": ("batch_size",),
    "extra_topk_length": ("batch_size",),
}
_PREFILL = {
    "q": ("num_tokens", "num_qo_heads", "head_dim_qk"),
    "kv": ("num_kv", "num_kv_heads", "head_dim_qk"),
    "indices": ("num_tokens", "num_kv_heads", "topk_width"),
    "ragged_indices": ("num_tokens", "num_kv_heads", "topk_width"),
    "topk_length": ("num_tokens",),
    "attn_sink": ("num_qo_heads",),
    "cu_seqlens_k": ("num_requests_plus_one",),
}
_INDEXER = {
    "q": ("batch_size", "s_q", "num_index_heads", "index_head_dim"),
    "weights": ("num_rows", "num_index_heads"),
    "kv_cache": ("num_pages", "page_size", "num_kv_heads", "index_record_bytes"),
    "block_table": ("batch_size", "max_num_pages"),
    "kv": ("num_keys", "index_head_dim"),
    "kv_scales": ("num_keys",),
    "ks": ("num_rows",),
    "ke": ("num_rows",),
}
_CACHE = {"k_cache": ("num_pages", "page_size", "num_kv_heads", "record_bytes")}
_REMAP = {
    "local_indices": ("batch_size", "s_q", "topk"),
    "block_table": ("batch_size", "max_num_pages"),
}
_TOPK = {
    "logits": ("num_rows", "num_keys"),
    "lengths": ("num_rows",),
    "row_starts": ("num_rows",),
    "block_table": ("batch_size", "max_num_pages"),
    "row_to_batch": ("num_rows",),
    "offsets": ("num_rows",),
}
AXIS_NAMES = {
    "decode": _DECODE,
    "prefill": _PREFILL,
    "indexer": _INDEXER,
    "cache": _CACHE,
    "remap": _REMAP,
    "topk": _TOPK,
}

# Constant axes: what each means (their values come from the inputs of one case).
CONSTANT = {
    "num_qo_heads": "query heads per rank (useful heads; a kernel pads them itself)",
    "head_dim_qk": "q/k head dim (the latent plus the rope part)",
    "head_dim_v": "output head dim",
    "page_size": "tokens per cache page",
    "num_kv_heads": "one latent head (MQA)",
    "record_bytes": "bytes of one token's FP8 record (values, scales, bf16 rope)",
    "index_record_bytes": "bytes of one token's indexer key (FP8 values + fp32 scale)",
    "topk": "main-cache top-k width of each query (-1 pads)",
    "extra_topk": "compressed-cache top-k width of each query (-1 pads)",
    "topk_width": "index columns of the bf16 prefill call (the widths padded to 128)",
    "num_index_heads": "indexer heads",
    "index_head_dim": "indexer head dim",
    "page_stride_bytes": "bytes from one cache page to the next (padded for V4 pages); the int8 "
    "records here are contiguous, a kernel that reads the engine's padding needs them re-strided",
    "split_page_size": "tokens per page of the re-paged cache (FlashInfer's sm120 kernels)",
    "splits_per_page": "64-token pages each cache page splits into (page_size / 64)",
}


def exportable(case: Case) -> bool:
    """Whether their format has this case's call: not the cache writers (an in-place write) nor
    the remap's prefill-workspace and DCP forms (their definitions know none of them)."""
    return case.op != "cache_write" and not (case.op == "remap" and (case.tokens or case.form))


def family(case: Case) -> str:
    """Which input naming a case's call uses."""
    if case.decode_shape:
        return "decode"
    return {"dequant": "cache", "page_split": "cache"}.get(case.op, case.op)


def axis_names(case: Case, name: str, rank: int) -> tuple[str, ...]:
    names = AXIS_NAMES.get(family(case), {}).get(name)
    if case.op == "indexer" and name == "q" and rank == 3:  # the ragged form
        names = ("num_rows", "num_index_heads", "index_head_dim")
    if case.op == "indexer" and name == "context_lens":
        names = ("batch_size",) if rank == 1 else ("batch_size", "s_q")
    if names is None or len(names) != rank:
        return tuple(f"{name}_dim{i}" for i in range(rank))
    return names


@dataclass(frozen=True)
class TensorShape:
    """One input or output: its shape and dtype, as the case makes it."""

    shape: tuple[int, ...]
    dtype: str
    page_stride_bytes: int = 0  # a cache's stride(0) in bytes; 0 for anything else


def shapes_of(inputs: dict) -> dict[str, TensorShape]:
    out = {}
    for name, t in inputs.items():
        if t is None:
            continue
        if t.dtype not in DTYPES:
            raise ValueError(f"input {name}: dtype {t.dtype} has no flashinfer-bench dtype")
        stride = t.stride(0) * t.element_size() if name.endswith("cache") and t.dim() == 4 else 0
        out[name] = TensorShape(tuple(t.shape), DTYPES[t.dtype], stride)
    return out


def definition_key(case: Case) -> str:
    """The constant fields, as text: cases with the same key share one definition."""
    fixed = {k: v for k, v in case.params().items() if k not in VARYING}
    # calls with other inputs: a ragged batch (V4 decode: counts; prefill: offsets) and the
    # indexer's and top-k's chunk form (cases/indexer_case.py)
    if case.context_lens:
        fixed["ragged_batch"] = True
    if case.op in ("indexer", "topk") and case.tokens:
        fixed["chunk"] = True
    return json.dumps(fixed, sort_keys=True)


def definition_name(case: Case) -> str:
    """Readable part (their naming: op, heads, dims, top-k, page size) plus a hash of every
    constant field (scale convention, head padding, softmax scale tell definitions apart too)."""
    c = case
    parts = [f"dsv4bench_{c.op}", c.model.replace(".", "p"), c.layout, f"h{c.num_heads}"]
    parts += [f"qk{c.d_qk}", f"v{c.d_v}", f"topk{c.topk}"]
    parts += [f"extra{c.extra_topk}"] if c.extra_topk else []
    parts += [f"ps{c.page_size}"]
    parts += ["ragged"] if c.context_lens else []
    parts += ["chunk"] if c.op in ("indexer", "topk") and c.tokens else []
    parts += [f"w{c.window}"] if c.window else []
    parts += [f"c{c.compress_ratio}"] if c.compress_ratio else []
    parts += ["sink"] if c.sink else []
    parts += [c.route.replace("-", "")] if c.op == "prefill" else []
    parts += [c.form] if c.form else []
    digest = hashlib.sha1(definition_key(case).encode()).hexdigest()[:6]
    return "_".join([*parts, digest]).replace("-", "")


def output_specs(case: Case) -> dict[str, tuple[tuple[str, ...], str, str]]:
    """{name: (axes, dtype, description)} of what the call returns, in their form. Every axis
    is an input's or a constant (output_constants): their runner sizes the outputs from the
    inputs (Definition.get_axes_values_from_inputs)."""
    fam = family(case)
    lse = "log-sum-exp of the scaled logits in base 2 (theirs; the oracle's natural log / ln 2), "
    lse += "before the sink; +inf for a query without a valid index (FlashMLA's convention)"
    if fam in ("decode", "prefill"):
        rows = ("batch_size", "s_q") if fam == "decode" else ("num_tokens",)  # q's own rows
        out = {
            "output": ((*rows, "num_qo_heads", "head_dim_v"), "bfloat16", "attention output"),
            "lse": ((*rows, "num_qo_heads"), "float32", lse),
        }
        if fam == "prefill":
            out["max_logits"] = (
                ("num_tokens", "num_qo_heads"),
                "float32",
                "largest scaled logit of each query and head (-inf without a valid index)",
            )
        return out
    if fam == "indexer":
        return {"logits": _indexer_logits(case), "topk_indices": _picks("top-k key indices")}
    if fam == "topk":
        return {"topk_indices": _picks(f"picks in form {case.form}")}
    if fam == "remap":
        return {"global_indices": (("batch_size", "s_q", "topk"), "int32", "cache slots")}
    if case.op == "dequant":
        return {
            "output": (
                ("num_pages", "page_size", "head_dim_qk"),
                "bfloat16",
                "dequantized cache, the slots of each page in order",
            )
        }
    split = ("num_pages", "splits_per_page", "split_page_size", "num_kv_heads", "record_bytes")
    what = "the cache re-paged into 64-token pages, every token's bytes kept (page p's i-th "
    what += "64-token page is the re-paged cache's page p * splits_per_page + i)"
    return {"output": (split, "int8", what)}


def _picks(what: str) -> tuple[tuple[str, ...], str, str]:
    return ("num_rows", "topk"), "int32", f"{what}, -1 padded"


def _indexer_logits(case: Case) -> tuple[tuple[str, ...], str, str]:
    if case.tokens:  # the ragged form: a column per contiguous key
        return ("num_rows", "num_keys"), "float32", "the indexer's fp32 logits"
    what = "the indexer's fp32 logits, key position p of a row's request at "
    what += "[row, p // page_size, p % page_size] (DeepGEMM's max_model_len columns, padded with "
    what += "-inf to the block table's max_num_pages * page_size)"
    return ("num_rows", "max_num_pages", "page_size"), "float32", what


def output_constants(case: Case) -> dict[str, int]:
    """Constant axes only the outputs have: their values from the case's fields."""
    out = {"head_dim_v": case.d_v, "head_dim_qk": case.d_qk, "topk": case.topk}
    if case.op == "page_split":
        out |= {"split_page_size": SPLIT_PAGE, "splits_per_page": case.page_size // SPLIT_PAGE}
    return out


def definition(case: Case, shapes: dict[str, TensorShape], reference: str) -> dict:
    """Their Definition (as JSON data) of every case sharing this case's constant fields;
    `shapes` are one such case's inputs (the constant dims are the same in all)."""
    axes: dict[str, dict] = {}
    inputs = {}
    for name, t in shapes.items():
        names = axis_names(case, name, len(t.shape))
        for axis, size in zip(names, t.shape, strict=True):
            _add_axis(axes, axis, size, name)
        inputs[name] = {"shape": list(names), "dtype": t.dtype, "description": _what(name)}
        if t.page_stride_bytes:
            _add_axis(axes, "page_stride_bytes", t.page_stride_bytes, name)
    outputs = {}
    constants = output_constants(case)
    for name, (names, dtype, what) in output_specs(case).items():
        for axis in names:
            if axis in constants:
                _add_axis(axes, axis, constants[axis], name)
            elif axis not in axes:
                raise ValueError(f"output {name}: axis {axis} is no input's and no constant")
        outputs[name] = {"shape": list(names), "dtype": dtype, "description": what}
    fixed = json.loads(definition_key(case))
    return {
        "name": definition_name(case),
        "op_type": OP_TYPE,
        "description": (
            f"dsv4bench {case.op} ({case.model}, {case.layout} cache, route {case.route}): "
            "the suite's oracle is the reference. Constant case fields: "
            + ", ".join(f"{k}={v}" for k, v in fixed.items())
        ),
        "tags": [
            f"model:{case.model}",
            f"layout:{case.layout}",
            f"op:{case.op}",
            "source:dsv4bench",
        ],
        "axes": axes,
        "inputs": inputs,
        "outputs": outputs,
        "reference": reference,
    }


def _add_axis(axes: dict, axis: str, size: int, tensor: str) -> None:
    if axis not in CONSTANT:
        axes.setdefault(axis, {"type": "var"})
        return
    have = axes.setdefault(axis, {"type": "const", "value": size, "description": CONSTANT[axis]})
    if have["value"] != size:
        raise ValueError(f"{tensor}: axis {axis} is {size} here, {have['value']} elsewhere")


_WHAT = {
    "q": "queries (bf16; FP8 for the indexer)",
    "k_cache": "paged FP8 cache as int8 records (reference/layouts.py has the byte layout)",
    "extra_k_cache": "V4 compressed cache (C4/C128 entries), int8 records",
    "indices": "global cache slots (page * page_size + offset) of each query's top-k, -1 pads",
    "extra_indices": "compressed-cache slots of each query's top-k, -1 pads",
    "attn_sink": "per-head attention sink logit",
    "topk_length": "valid indices of each row (the rest is padding)",
    "kv": "dequantized bf16 workspace the indices address",
}


def _what(name: str) -> str:
    return _WHAT.get(name, name.replace("_", " "))


def shrunk(case: Case) -> Case:
    """The same constant fields at the smallest variable sizes: its inputs show the definition's
    inputs, ranks and constant dims without allocating a big case's cache. A ragged batch stays
    ragged (its shortest and longest requests): its call has inputs a uniform one lacks."""
    lens = case.context_lens
    if len(lens) > 1:
        lens = (min(lens), max(lens))
    return dataclasses.replace(
        case,
        batch_size=len(lens) or 1,
        s_q=min(case.s_q, 2),
        tokens=min(case.tokens, 16),
        context_lens=lens,
    )
