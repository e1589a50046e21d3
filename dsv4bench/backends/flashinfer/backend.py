"""FlashInfer sparse MLA decode: trtllm-gen kernels on sm100, the sm120 kernels on sm120; on
sm90 the FA3 MLA kernel as sparse attention, decode and prefill (sm90.py).

The four entry points, by arch and cache layout (flashinfer-ai/flashinfer; names and argument
names as in flashinfer/mla/_core.py, flashinfer/mla/_sparse_mla_sm120.py (older builds:
flashinfer/sparse_mla_sm120.py), tests/attention/test_trtllm_gen_mla.py,
tests/attention/test_sparse_mla_sm120.py, tests/attention/sparse_mla_test_utils.py, and vLLM's
vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py):

  sm100 V3.2  flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla(query [B, q_len, h, 576],
      kv_cache [pages, 1, P, 576] bf16 or e4m3 (dtype = query dtype), workspace_buffer (zeroed),
      qk_nope_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64, block_tables [B, q_len, topk]
      = global slots, seq_lens [B], max_seq_len, sparse_mla_top_k=topk, out, bmm1_scale,
      bmm2_scale, sinks [Tensor], backend) -> out [B, q_len, h, 512]; no lse. vLLM passes one
      query per row (q_len 1) and seq_lens = the row's number of valid indices.
  sm100 V4    flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4(query [B, q_len, h, 512],
      swa_kv_cache and compressed_kv_cache (two pools, HND [pages, 1, P, 512], dtype = query
      dtype), workspace_buffer, sparse_indices [B*q_len, W] (W >= 128, W % 4 == 0: the first 128
      columns index the SWA pool, the rest the compressed pool), sparse_topk_lens [B*q_len] =
      128 + active compressed entries, seq_lens [B] (the SWA tile's valid prefix is
      min(seq_lens - q_len + q_idx + 1, 128)), out, bmm1_scale, bmm2_scale, sinks [h] fp32,
      kv_layout) -> out; no lse. Heads 8/16/32/64/128 from FlashInfer 0.6.14 (flashinfer-ai/
      flashinfer#3545, "Support smaller DSv4 sparse MLA head counts"; _check_dsv4_sparse_mla_
      inputs in flashinfer/mla/_core.py raises for any other count); 0.6.12 and 0.6.13 (#3269)
      take 64 or 128 only. vLLM pads to the smallest of (8, 16, 32, 64, 128) that fits
      (_SPARSE_MLA_SUPPORTED_Q_HEADS, "flashinfer>=0.6.14, #3545", in
      vllm/models/deepseek_v4/nvidia/flashinfer_sparse.py; a stale comment there still says
      {64, 128}): so does this adapter, and to 64/128 on an older build.
  sm120 V4    sparse_mla_sm120_decode_dsv4(q [T, h, 512], kv_cache 584 B in 64-token pages
      (the binding reads the page stride from stride(0)), indices [T, topk] with topk in
      {128, 512, 1024}, mid_out [T, h, splits, 512] bf16, mid_lse [T, h, splits] fp32
      (splits = ceil(topk/64) + ceil(extra_topk/64)), output [T, h, 512] bf16, out_lse [T, h]
      fp32, sm_scale, *, topk_length, attn_sink, extra_kv_cache, extra_indices,
      extra_topk_length); -1 = invalid; decode only (T <= 64, larger T is prefill's job).
  sm120 V3.2  sparse_mla_sm120_decode_dsv3_2(q [T, h, 576], kv_cache 656 B in 64-token pages,
      indices, mid_out, mid_lse, output, out_lse, sm_scale, *, topk_length, attn_sink): no
      extra cache; topk in {128, 512, 1024, 2048} (decode-v2 dispatch table).
  Both sm120 kernels write out_lse in base 2 with the sink merged in
  (log2(sum exp(s) + exp(sink))), per FlashInfer's test reference; finish() converts it to the
  oracle's natural-log lse without the sink. trtllm-gen returns no lse, so sm100 rows compare
  `out` only.

What prepare() does outside the timed call: flattens (b, s_q) into b*s_q query rows; pads heads
to 8/16/32/64/128; sm100: dequantizes the FP8 cache into plain rows (bf16 by default, exact for
V4 and for power-of-two V3.2 scales; or per-tensor e4m3 with q quantized the same way), keeps
V3.2's 576 columns (K = latent + rope; reference.layouts.to_plain_rows keeps 512, which is the
V4 width), moves each row's valid indices first (lengths are counts), pads the window to 128
columns and the index width to a multiple of 4 with -1; sm120: re-pages the cache to 64-token
pages (V4 split_pages_v4, V3.2 a view of its token-major records; slots unchanged) and pads the
index width with -1 to the kernel's dispatch set (extra width to a multiple of 64).

The sm120 page stride (FlashInfer csrc/sparse_mla_sm120_jit_binding.cu, parse_paged_kv_layout,
since 0.6.14, #3395): a 4-D cache [pages, 64, 1, 584] gives page_block_size = size(1) and the
page stride in bytes = stride(0) * element size, "padded block stride is OK"; the kernel reads
token t of page p at p * stride + t * 576 (data) and p * stride + 64 * 576 + t * 8 (scales)
(include/flashinfer/attention/sparse_mla_sm120/common/kv_cache_io.cuh). So any stride works
that keeps 16-byte alignment for cp.async.bulk: the unpadded 64 * 584 = 37376 of FlashInfer's
tests, the 37440 engines allocate (64 * 584 rounded up to 576: vLLM's SWA cache spec,
alignment=576) and this adapter passes, or 37888. Only the 2-D form [pages, page_bytes]
derives the page size from the width and needs exactly 37376.

NOT run here: any sm100/sm120 FlashInfer kernel (the sm90 FA3 path in sm90.py ran on an
H100). No sm100/sm120 GPU exists here, so those adapters were built against the public source above
and tested on the CPU with fake kernels that compute the answer from the converted inputs. Read in
FlashInfer's source (not run): the head sets per build and the sm120 page stride (above).
Unverified: that the installed build has these names and argument names (the API has moved between
releases), the head counts and topk limits it really accepts, that trtllm-gen honours `sinks` and
treats seq_lens as the per-row length in sparse V3.2 mode, the sm120 lse convention (base 2, sink
merged), that sm120 reads V3.2's fp32 scales as powers of two (v32_scale_reading "e8m0"), and what
the kernels do with a row that has no valid index (trtllm-gen DSv4 cannot express an empty window:
prepare() refuses it). kv_dtype "e4m3" requantizes the cache per tensor: on random data its cos_diff
against the oracle is about 1e-3, above the default tolerance, as expected of fp8 rows.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field

from dsv4bench.backends.base import (
    Backend,
    HeadRule,
    Prepared,
    Provider,
    Unsupported,
    check_cache_width,
    fp8_cache_reason,
    resolve_heads,
)
from dsv4bench.backends.flashinfer import sm90, sm100, sm120, topk
from dsv4bench.backends.flashinfer.convert import WORKSPACE_BYTES, apply_length
from dsv4bench.backends.paged_rows import KV_DTYPES
from dsv4bench.backends.toolchains.library import (
    LazyOps,
    on_sys_path,
    pinned_release_reason,
    site_folder,
)
from dsv4bench.cases.case import Case
from dsv4bench.measure import hardware

NOT_FOUND = "FlashInfer not found: pip install flashinfer-python (sparse MLA: sm90, sm100, sm120)"
ARCH_REASON = "FlashInfer's sparse MLA kernels run on sm90 (FA3 MLA), sm100 and sm120 only"
HEADS = (8, 16, 32, 64, 128)  # query heads every FlashInfer sparse MLA decode kernel takes
DSV4_OLD_HEADS = (64, 128)  # trtllm-gen DSv4 before 0.6.14 (flashinfer-ai/flashinfer#3545)
DSV4_SMALL_HEADS_SINCE = (0, 6, 14)

# (module, function) candidates per kernel, newest location first
CANDIDATES: dict[str, tuple[tuple[str, str], ...]] = {
    "trtllm_mla": (
        ("flashinfer.decode", "trtllm_batch_decode_with_kv_cache_mla"),
        ("flashinfer.mla", "trtllm_batch_decode_with_kv_cache_mla"),
    ),
    "trtllm_dsv4": (
        ("flashinfer.mla", "trtllm_batch_decode_sparse_mla_dsv4"),
        ("flashinfer.decode", "trtllm_batch_decode_sparse_mla_dsv4"),
    ),
    "sm120_dsv4": (
        ("flashinfer.mla._sparse_mla_sm120", "sparse_mla_sm120_decode_dsv4"),
        ("flashinfer.sparse_mla_sm120", "sparse_mla_sm120_decode_dsv4"),
    ),
    "sm120_dsv32": (
        ("flashinfer.mla._sparse_mla_sm120", "sparse_mla_sm120_decode_dsv3_2"),
        ("flashinfer.sparse_mla_sm120", "sparse_mla_sm120_decode_dsv3_2"),
    ),
    "fa3_mla": (("flashinfer.mla", "BatchMLAPagedAttentionWrapper"),),
    **topk.CANDIDATES,  # the indexer's top-k (op topk), one function per form
}
FAMILY = {
    ("sm100", "v32"): "trtllm_mla",
    ("sm100", "v4"): "trtllm_dsv4",
    ("sm120", "v4"): "sm120_dsv4",
    ("sm120", "v32"): "sm120_dsv32",
}


@dataclass
class KernelOps:
    """The FlashInfer functions this backend calls (None: not in this build), called with
    FlashInfer's own keyword names; `names` says where each was found."""

    provider: Provider
    trtllm_mla: Callable | None = None
    trtllm_dsv4: Callable | None = None
    sm120_dsv4: Callable | None = None
    sm120_dsv32: Callable | None = None
    fa3_mla: Callable | None = None  # the wrapper class (sm90)
    topk_plain: Callable | None = None  # flashinfer.topk's three (op topk)
    topk_page_table: Callable | None = None
    topk_ragged: Callable | None = None
    names: dict = field(default_factory=dict)


def discover(lib: str | None = None) -> KernelOps:
    """Import flashinfer (from `lib`'s build, an installed package, or the kernels folder) and
    look up the four entry points (missing ones stay None)."""
    on_sys_path(site_folder(lib, "flashinfer", "flashinfer-*", "FlashInfer"))
    try:
        fi = importlib.import_module("flashinfer")
    except ModuleNotFoundError as e:
        if e.name == "flashinfer":
            raise Unsupported(NOT_FOUND) from e
        raise Unsupported(f"cannot import flashinfer: {type(e).__name__}: {e}") from e
    except Exception as e:  # installed but broken (CUDA/torch mismatch...): say why
        raise Unsupported(f"cannot import flashinfer: {type(e).__name__}: {e}") from e
    prov = Provider("flashinfer", str(getattr(fi, "__version__", "unknown")), fi.__file__ or "")
    ops = KernelOps(prov)
    for key, candidates in CANDIDATES.items():
        for module, name in candidates:
            try:
                fn = getattr(importlib.import_module(module), name, None)
            except ImportError:
                continue
            if fn is not None:
                setattr(ops, key, fn)
                ops.names[key] = f"{module}.{name}"
                break
    return ops


# ---- query heads per build (the conversions: convert.py) ------------------


def version_tuple(version: str) -> tuple[int, ...] | None:
    """(0, 6, 18) of "0.6.18rc7"; None when the version says nothing ("unknown")."""
    import re

    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    return tuple(int(x) for x in m.groups(default="0")) if m else None


def heads_for(family: str, version: str) -> tuple[int, ...]:
    """Head counts a kernel family of a FlashInfer build takes: trtllm-gen DSv4 took 64 or 128
    until 0.6.14; every other family (and an unknown version) the full HEADS."""
    v = version_tuple(version)
    if family == "trtllm_dsv4" and v is not None and v < DSV4_SMALL_HEADS_SINCE:
        return DSV4_OLD_HEADS
    return HEADS


def padded_heads(case: Case, heads: tuple[int, ...] = HEADS) -> tuple[int, str | None]:
    """Query heads handed to the kernel (one of `heads`; an engine pads to the next one), or a
    reason why none fits."""
    engine = next((n for n in heads if n >= case.num_heads), heads[-1])
    return resolve_heads(case, HeadRule("FlashInfer", heads, engine))


class FlashInfer(Backend):
    name = "flashinfer"
    description = (
        "FlashInfer sparse MLA: FA3 MLA (sm90), trtllm-gen (sm100), sm120 decode kernels; "
        "the indexer's top-k (flashinfer.topk)"
    )
    archs = ("sm90", "sm100", "sm120")
    ops = ("decode", "prefill", "topk")
    layouts = ("v32", "v4")
    options = {"kv_dtype": "bf16", "past_planner_limit": False, "lib": None}
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "sm90: yes (natural log); sm120: yes (base 2, converted); sm100: no "
        "(trtllm-gen returns none)",
        "CUDA graphs": "yes: plan() and every conversion in prepare(), the call is run()",
        "batch invariance": "not promised: the sm90 plan splits KV by the batch's work",
    }

    @property
    def bf16_kv(self) -> bool:
        """Its kernels read a bf16 cache only (kv_dtype bf16): engines keep the cache in bf16."""
        return self.kv_dtype == "bf16"

    def __init__(
        self,
        ops: KernelOps | Callable | None = None,
        *,
        kv_dtype: str = "bf16",
        past_planner_limit: bool = False,
        arch: str | None = None,
        workspace_bytes: int = WORKSPACE_BYTES,
        lib: str | None = None,
    ):
        """ops: injected KernelOps (or a factory of one) instead of importing flashinfer.
        kv_dtype: trtllm-gen plain-row dtype, "bf16" or "e4m3" (per-tensor scale).
        arch: the kernel family to prepare for ("sm100"/"sm120"); default: the device's.
        past_planner_limit: on sm90, run cases past the FA3 MLA planner's 16384 work items
        (unsupported by default: their rows are wrong, see sm90.PLANNER_WORKS)."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
        self.lib = lib  # a `kernels fetch` build's folder (its site/ goes on sys.path)
        self._found = LazyOps(ops, lambda: discover(self.lib))
        self.kv_dtype = kv_dtype
        self.past_planner_limit = past_planner_limit
        self.arch = arch
        self.workspace_bytes = workspace_bytes

    def kernel_ops(self) -> KernelOps:
        return self._found.get()

    def process_key(self) -> str:
        return f"{self.base}.lib={self.lib}" if self.lib else ""  # one flashinfer a process

    def build_reason(self) -> str | None:
        return pinned_release_reason(self.lib)

    def provider(self) -> Provider:
        return self.kernel_ops().provider

    def v32_scale_reading(self, arch: str) -> str | None:
        # sm100: prepare() dequantizes exactly into plain rows. sm120: FlashInfer's default
        # V3.2 format takes power-of-two fp32 scales (non-power-of-two needs its
        # "arbitrary_fp32" format), read here as an exponent: unverified on hardware.
        # sm90 (FA3 MLA): bf16(e4m3 * fp32 scale), the product rounded once; e4m3 in place
        # (mla_hopper.cuh repack_fp8_kv_to_bf16), bf16 by this backend's conversion
        return {"sm90": sm90.V32_SCALE_READING, "sm120": "e8m0"}.get(arch)

    def supports(self, case: Case, arch: str) -> str | None:
        if arch not in self.archs:
            return f"{ARCH_REASON}, not {arch}"
        reason = super().supports(case, arch) or self.build_reason()
        if reason or case.op == "topk":
            return reason or topk.supports(case)
        if arch == "sm90":
            return sm90.supports(case, self.past_planner_limit)
        if case.op != "decode":
            return f"FlashInfer's sparse MLA kernels on {arch} are decode kernels (no {case.op})"
        reason = fp8_cache_reason(case, "FlashInfer's sparse MLA kernels")
        if reason:
            return reason
        if case.d_v != 512:
            return f"FlashInfer's sparse MLA kernels take d_v 512, not {case.d_v}"
        if case.topk <= 0:
            return "FlashInfer's sparse MLA kernels need topk > 0"
        if case.layout == "v32" and case.extra_topk:
            return "FlashInfer's V3.2 (d_qk 576) sparse MLA kernels take no extra cache"
        reason = padded_heads(case)[1]
        if reason:
            return reason
        return (sm100 if arch == "sm100" else sm120).supports(case)

    def prepare_reason(self, case: Case, device: str) -> str | None:
        self.kernel_ops()  # Unsupported first when FlashInfer is absent
        return self.supports(case, self.arch or hardware.arch_of(device))

    def prepare_case(self, case: Case, inputs: dict, device: str) -> Prepared:
        ops = self.kernel_ops()
        arch = self.arch or hardware.arch_of(device)
        if case.op == "topk":
            fn = getattr(ops, f"topk_{case.form}", None)
            return topk.prepare(case, inputs, device, fn, ops.provider.version)
        if arch == "sm90":
            if ops.fa3_mla is None:
                raise Unsupported(
                    f"flashinfer {ops.provider.version} has no BatchMLAPagedAttentionWrapper"
                )
            return sm90.prepare(
                case, inputs, device, ops.fa3_mla, self.kv_dtype, self.past_planner_limit
            )
        key = FAMILY[(arch, case.layout)]
        fn = getattr(ops, key)
        if fn is None:
            module, name = CANDIDATES[key][0]
            raise Unsupported(
                f"flashinfer {ops.provider.version} has no {name} (looked in {module} and "
                f"{CANDIDATES[key][1][0]}); needed for {case.layout} on {arch}"
            )
        x = dict(inputs)
        for k in ("k_cache", "extra_k_cache"):
            if x.get(k) is not None:
                check_cache_width(case, k, x[k])
        x["indices"] = apply_length(x["indices"], x.get("topk_length"))
        if x.get("extra_indices") is not None:
            x["extra_indices"] = apply_length(x["extra_indices"], x.get("extra_topk_length"))
        heads, reason = padded_heads(case, heads_for(key, ops.provider.version))
        if reason:
            raise Unsupported(f"flashinfer {ops.provider.version}: {reason}")
        info = {"padded_heads": heads, "kernel": ops.names.get(key, key), "family": key}
        if key == "trtllm_mla":
            return sm100.prepare_v32(case, x, fn, heads, info, self.kv_dtype, self.workspace_bytes)
        if key == "trtllm_dsv4":
            return sm100.prepare_v4(case, x, fn, heads, info, self.kv_dtype, self.workspace_bytes)
        return sm120.prepare(case, x, fn, heads, info)
