"""FlashAttention-3 (vLLM's `_vllm_fa3_C` build, or sgl-kernel's) as sparse MLA, decode and
prefill, fed as vLLM's FLASH_ATTN_MLA_SPARSE (vllm/v1/attention/backends/mla/
flashattn_mla_sparse.py) and sglang's `fa3` NSA backend feed it: the sglang default for decode
on H200 and vLLM's first sparse MLA choice on Hopper with a bf16 cache (docs/kernel-facts.md,
FA3 as sparse MLA).

The op (schema of torch.ops._vllm_fa3_C.fwd in the vLLM 0.26.0 wheel, printed on the H100):
  fwd(q, k, v, k_new, v_new, q_v, out, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_new,
      seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, page_table, kv_batch_idx, leftpad_k,
      rotary_cos, rotary_sin, seqlens_rotary, q_descale, k_descale, v_descale, softmax_scale,
      is_causal, window_size_left, window_size_right, softcap, is_rotary_interleaved,
      scheduler_metadata, num_splits, pack_gqa, sm_margin, s_aux, cp_world_size, cp_rank,
      cp_tot_seqused_k) -> [out (T, h, d_v), softmax_lse (h, T) natural log, ...]
The call is bound by argument name (bind()), so sgl-kernel's op (`qv`, `page_table`,
`attention_chunk`, ...) takes the same mapping.

Sparse MLA through it: one KV head, page size 1, so a row of the page table is the row's list
of KV slots and seqused_k its length; each query token is its own varlen row (cu_seqlens_q =
0..T, max_seqlen_q 1; MTP's s_q > 1 tokens are more rows, each with its own list), and the
score is softmax_scale * (q.k + q_v.v):
  V3.2 (d_qk 576): q = the 64 rope columns vs k = the rope cache, q_v = the 512 latent columns
      vs v = the latent cache (what both engines pass).
  V4 (d_qk 512, rope inside the latent, d_v 512): q = 64 latent columns vs k = the same 64
      cache columns, q_v = q with those 64 columns zeroed vs v = the whole latent cache, so
      q.k + q_v.v = q.kv over all 512 columns and out = softmax . kv (docs/kernel-facts.md,
      FA3 as sparse MLA).
Outside the timed call, as engines do outside attention: the FP8 cache dequantized into one
bf16 pool [main slots; extra slots] (engines keep a bf16 cache for this backend), each row's
index list = valid main slots then valid extra slots (shifted by the main slot count), valid
entries first (engines' top-k writes -1 only at the tail; `topk_length` and -1 both end a list),
and V4's q_v. Heads are not padded (vLLM passes num_heads per rank; an explicit head_padding
pads with zero queries). FA3 plans its own schedule inside the call (scheduler_metadata None,
num_splits 0), as vLLM's FLASH_ATTN_MLA_SPARSE calls it; causal as vLLM (one query per row: the
whole list is visible).

Sinks (V4): FA3's s_aux refuses this shape ("We don't support S aux with hdim != hdim_v"), so
run() scales out by sigmoid(lse - sink) inside the timed call; the lse stays that of the keys.
FP8: refused for head_dim_v 512 ("HeaddimV > 256 requires fp16 and bf16"), so kv_dtype e4m3
is unsupported with that reason. A row with no key gives out 0 and lse -inf (the oracle: +inf).
Measured on the H100 (results/sm90/engines-h100/probe.log): cos_diff ~2e-6 against fp32 for
V3.2 and V4 at 1..128 heads, lse within 2e-6.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from dsv4bench.backends import paged_rows
from dsv4bench.backends.base import (
    HeadRule,
    Prepared,
    Provider,
    Unsupported,
    fp8_cache_reason,
    pad_heads,
    pad_sink,
    resolve_heads,
)
from dsv4bench.backends.toolchains import library
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output, prefill_output

ENV_LIB = library.lib_env("fa3")
LIB_FILE = "_vllm_fa3_C.abi3.so"
DEFAULT_GLOB = ".kernels/fa3-vllm-*/" + LIB_FILE  # a fetched build (or an older packing's .xz)
NOT_FOUND = (
    "FA3 not found: install vllm or sgl-kernel, or pass --backend-opt fa3.lib=PATH "
    f"(or {ENV_LIB}; default {DEFAULT_GLOB} of the checkout)"
)
D_V = 512
QK_COLS = 64  # columns given as q/k: V3.2's rope, V4's first 64 latent columns
FP8_REASON = (
    "FA3 refuses an FP8 cache for head_dim_v 512 ('HeaddimV > 256 requires fp16 and bf16'); "
    "engines run it on a bf16 cache: kv_dtype bf16"
)

# our name -> the names an op's schema may use for it; values every call passes
ALIASES = {
    "q_v": ("q_v", "qv"),
    "page_table": ("page_table", "block_table"),
    "is_causal": ("is_causal", "causal"),
    "is_rotary_interleaved": ("is_rotary_interleaved", "rotary_interleaved"),
}
FIXED = {
    "window_size_left": -1,
    "window_size_right": -1,
    "softcap": 0.0,
    "is_rotary_interleaved": True,
    "num_splits": 0,
    "sm_margin": 0,
    "cp_world_size": 1,
    "cp_rank": 0,
    "attention_chunk": 0,
}


@dataclass(frozen=True)
class Arg:
    """One argument of the op's schema: enough to bind a call by name."""

    name: str
    optional: bool  # Tensor? / int?: None is allowed
    has_default: bool


@dataclass
class FA3Ops:
    provider: Provider
    fwd: Callable  # fwd(**our names) -> (out, lse, ...)
    names: tuple[str, ...] = ()


def schema_args(packet) -> list[Arg]:
    schema = packet.default._schema
    return [Arg(a.name, is_optional(str(a.type)), a.has_default_value()) for a in schema.arguments]


def is_optional(type_text: str) -> bool:
    """A schema type that takes None: `Tensor?` as the schema prints, `Optional[Tensor]` as
    the argument's type object prints (what schema_args reads)."""
    return type_text.endswith("?") or type_text.startswith("Optional[")


def bind(args: list[Arg], op: Callable) -> Callable:
    """A call of `op` by our argument names: each schema argument takes our value (or FIXED's),
    None if it is optional, its default if it has one; anything else is an unknown API."""
    ours = {}
    for arg in args:
        ours[arg.name] = next((k for k, v in ALIASES.items() if arg.name in v), arg.name)
    for arg in args:
        key = ours[arg.name]
        if key in FIXED or arg.optional or arg.has_default:
            continue
        if key not in CALL_KEYS:
            raise Unsupported(f"FA3 fwd: unknown required argument {arg.name!r}")

    def call(**values):
        kw = {}
        for arg in args:
            key = ours[arg.name]
            if key in values:
                kw[arg.name] = values[key]
            elif key in FIXED:
                kw[arg.name] = FIXED[key]
            elif arg.optional:
                kw[arg.name] = None
        return op(**kw)

    return call


# what prepare() passes (the rest is FIXED or None)
CALL_KEYS = (
    "q",
    "k",
    "v",
    "q_v",
    "out",
    "cu_seqlens_q",
    "seqused_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "page_table",
    "softmax_scale",
    "is_causal",
)


def ops_from_namespace(namespace: str, provider: Provider) -> FA3Ops:
    import torch

    ns = getattr(torch.ops, namespace)
    if not hasattr(ns, "fwd"):
        raise Unsupported(f"torch.ops.{namespace} has no fwd (not an FA3 build)")
    args = schema_args(ns.fwd)
    return FA3Ops(provider, bind(args, ns.fwd.default), tuple(a.name for a in args))


def _vllm_ops(build: library.Build) -> FA3Ops:
    library.load_engine_library(build)
    prov = Provider("vllm.vllm_flash_attn", build.version, build.path)
    return ops_from_namespace("_vllm_fa3_C", prov)


def _sgl_kernel_ops(build: library.Build) -> FA3Ops:
    mod = importlib.import_module("sgl_kernel.flash_attn")  # registers torch.ops.sgl_kernel
    prov = Provider("sgl_kernel.flash_attn", f"sgl-kernel {build.version}", mod.__file__)
    return ops_from_namespace("sgl_kernel", prov)


def load_file(path: str) -> FA3Ops:
    """The op of an FA3 library file (its folder, or a packed .xz): whichever namespace it
    registers."""
    import torch

    so, prov = library.load_op_library(path, "FA3", LIB_FILE, "fa3.lib", ENV_LIB)
    for namespace in ("_vllm_fa3_C", "sgl_kernel"):
        if hasattr(getattr(torch.ops, namespace), "fwd"):
            return ops_from_namespace(namespace, prov)
    raise Unsupported(f"{so} registers no FA3 fwd op (looked in _vllm_fa3_C, sgl_kernel)")


LIBRARY = library.LibrarySpec(
    name="FA3",
    not_found=NOT_FOUND,
    sources=(
        library.engine_source("vllm", "vllm", "vllm_flash_attn", "_vllm_fa3_C*.so", _vllm_ops),
        library.package_source("sgl-kernel", "sgl_kernel", _sgl_kernel_ops),
    ),
    load_file=load_file,
    env_var=ENV_LIB,
    kernels=(DEFAULT_GLOB, DEFAULT_GLOB + ".xz"),  # a packed copy is unpacked once
)


def discover(lib_path: str | None = None) -> FA3Ops:
    """An explicit library (argument or $DSV4BENCH_FA3_LIB) wins; else an installed package;
    else the checkout's kernels folder (library.discover)."""
    return library.discover(LIBRARY, lib_path)


# ---- the call's arguments -------------------------------------------------------------------


def padded_heads(case: Case) -> tuple[int, str | None]:
    """Heads handed to the kernel: any count, none padded by default (vLLM passes num_heads per
    rank), an explicit head_padding pads with zero queries."""
    return resolve_heads(case, HeadRule("FA3", None, case.num_heads))


def split_query(q, d_qk: int):
    """(q for k, q_v for v) of q (T, h, d_qk): V3.2 rope | latent, V4 64 columns | the rest."""
    if d_qk == 576:
        return q[..., D_V:], q[..., :D_V]
    qv = q.clone()
    qv[..., :QK_COLS] = 0
    return q[..., :QK_COLS], qv


def split_pool(rows, d_qk: int):
    """(k, v) paged views [slots, 1, 1, cols] of the bf16 pool rows [slots, d_qk]."""
    paged = rows.view(rows.shape[0], 1, 1, d_qk)
    k = paged[..., D_V:] if d_qk == 576 else paged[..., :QK_COLS]
    return k, paged[..., :D_V]


# ---- the backend ----------------------------------------------------------------------------


class FA3(library.LibraryBackend):
    name = "fa3"
    description = "FlashAttention-3 (vLLM/sgl-kernel build) as sparse MLA over a bf16 cache"
    archs = ("sm90",)
    ops = ("decode", "prefill")
    options = {"lib": None, "kv_dtype": "bf16"}
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "yes: softmax_lse (h, T), natural log",
        "CUDA graphs": "yes: index lists and page table made in prepare(), the call is the op "
        "(+ the sink scaling on the GPU)",
        "batch invariance": "not promised: num_splits is left to FA3's heuristic, which reads "
        "the batch",
    }

    @property
    def bf16_kv(self) -> bool:
        """Its kernels read a bf16 cache only (kv_dtype bf16): engines keep the cache in bf16."""
        return self.kv_dtype == "bf16"

    def __init__(self, lib: str | None = None, kv_dtype: str = "bf16", ops=None):
        if kv_dtype not in paged_rows.KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {paged_rows.KV_DTYPES}, got {kv_dtype!r}")
        self.kv_dtype = kv_dtype
        self._find_with(lib, ops, discover)

    def supports(self, case: Case, arch: str) -> str | None:
        return super().supports(case, arch) or self.case_reason(case)

    def case_reason(self, case: Case) -> str | None:
        """Why this case cannot run on FA3 whatever the GPU; None if it can."""
        if self.kv_dtype != "bf16":
            return FP8_REASON
        if case.d_qk not in (576, 512):
            return f"FA3 sparse MLA takes d_qk 576 (V3.2) or 512 (V4), not {case.d_qk}"
        if case.d_v != D_V:
            return f"FA3 sparse MLA returns the 512-wide latent as V; d_v {case.d_v} is not 512"
        if case.decode_shape is not None:
            reason = fp8_cache_reason(case, "FA3's cache conversions")
            if reason:
                return reason
        if case.topk + case.extra_topk <= 0:
            return "FA3 sparse MLA needs topk + extra_topk > 0"
        return padded_heads(case)[1]

    def prepare_reason(self, case: Case, device: str) -> str | None:
        return self.case_reason(case)

    def prepare_case(self, case: Case, inputs: dict, device: str) -> Prepared:
        ops = self.kernel_ops()
        return prepare_call(case, inputs, device, ops)


def prepare_call(case: Case, x: dict, device: str, ops: FA3Ops) -> Prepared:
    """Conversions outside the timed call; run() = the op (+ the sink scaling)."""
    import torch

    heads, reason = padded_heads(case)
    if reason:
        raise Unsupported(reason)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    q, rows, idx, ok = paged_rows.bf16_rows(case, x)
    t, h, _ = q.shape
    table, lens = paged_rows.page_table(idx, ok)
    qk, qv = split_query(pad_heads(q, heads, 1).to(torch.bfloat16), case.d_qk)
    k, v = split_pool(rows, case.d_qk)
    sync()
    info = {
        "kernel": "FA3 fwd (page size 1, one KV head, q/k + q_v/v)",
        "kv_dtype": "bf16",
        "convert_ms": (time.perf_counter() - t0) * 1e3,
        "padded_heads": heads,
        "query_rows": t,
        "kv_entries": int(lens.sum()),
        "index_lists": "valid entries first, compacted outside the timed call",
    }
    out = torch.empty(t, heads, D_V, dtype=torch.bfloat16, device=q.device)
    call = dict(
        q=qk,
        k=k,
        v=v,
        q_v=qv,
        out=out,
        cu_seqlens_q=torch.arange(t + 1, dtype=torch.int32, device=q.device),
        seqused_k=lens,
        max_seqlen_q=1,
        max_seqlen_k=table.shape[1],
        page_table=table,
        softmax_scale=case.scale,
        is_causal=True,
    )
    sink = pad_sink(x.get("attn_sink"), heads)
    if sink is not None:
        sink = sink.to(q.device)
        info["sink"] = "out *= sigmoid(lse - sink), inside the timed call"

    def run():
        res = ops.fwd(**call)
        o, lse = res[0], res[1]
        if sink is not None:
            paged_rows.scale_by_sink(o, lse.transpose(0, 1), sink)  # lse (h, T)
        return o, lse

    def finish(raw) -> Output:
        o, lse = raw[0][:, :h], raw[1][:h].transpose(0, 1)  # lse (h, T) -> (T, h)
        lse = paged_rows.no_key_lse(lse)
        if case.decode_shape is None:
            return Output(o, lse)
        b, s_q = case.decode_shape
        if o.shape[0] == 0:  # an empty chunk (cases/edges.py): the tokens' axis is 0
            b, s_q = (b, 0) if case.route == "decode-mixed" else (0, s_q)
        o4, lse3 = o.reshape(b, s_q, h, o.shape[-1]), lse.reshape(b, s_q, h).transpose(1, 2)
        return prefill_output(o4, lse3) if case.op == "prefill" else Output(o4, lse3)

    # a refill (run/padded.py) takes the next batch only if its pool and page table keep these
    # shapes: max_seqlen_k is a number fixed at capture
    buffers = (*(v for v in call.values() if hasattr(v, "data_ptr")), sink)
    return Prepared(run, finish, lambda: out.fill_(math.nan), info, buffers=buffers)
