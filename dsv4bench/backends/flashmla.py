"""FlashMLA sparse decode (FP8 cache) and sparse prefill (bf16 workspace), from any build found.

The ops (schemas in the vLLM 0.26.0 wheel's _flashmla_C.abi3.so; vllm-project/FlashMLA
csrc/api/sparse_decode.h and sparse_fwd.h):
  sparse_decode_fwd(q, kv, indices, topk_length, attn_sink, tile_scheduler_metadata, num_splits,
      extra_kv, extra_indices, extra_topk_length, d_v, sm_scale[, out_])
    -> (out (b, s_q, h, d_v) bf16, lse (b, h, s_q) fp32, tile_scheduler_metadata, num_splits)
    Given no schedule, the op first computes one (a single block with 4*(5b+1) B of shared
    memory) and returns it; flash_mla_with_kvcache passes it back on every later call. So
    prepare() calls once to schedule, and run() (the timed call) reuses that schedule.
  sparse_prefill_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length[, out_])
    -> [out (s_q, h, d_v) bf16, max_logits (s_q, h), lse (s_q, h)]
Both lse are natural-log logsumexp of q.k*scale (FlashMLA tests/ref.py compares them to
torch.logsumexp), the oracle's convention, so none is converted. Both kernels take 64 or 128
query heads only: fewer heads are zero-padded here and dropped in finish().
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsv4bench.backends.base import (
    HeadRule,
    Prepared,
    Provider,
    Unsupported,
    check_cache_width,
    fp8_cache_reason,
    pad_heads,
    pad_sink,
    resolve_heads,
)
from dsv4bench.backends.toolchains import library
from dsv4bench.cases.case import ROUTES, Case
from dsv4bench.cases.output import Output, prefill_output
from dsv4bench.measure import hardware

ENV_LIB = library.lib_env("flashmla")
LIB_FILE = "_flashmla_C.abi3.so"
# sgl-flash-mla 1.0.0: torch.ops.flash_mla_legacy holds the sm90 kernels upstream dropped
LEGACY_GLOB = "_C_legacy*.so"
NAMESPACES = ("_flashmla_C", "sgl_kernel", "flash_mla_legacy")
NOT_FOUND = (
    "FlashMLA not found: install flash_mla, vllm or sgl-kernel, "
    "or pass --backend-opt flashmla.lib=PATH"
)
DECODE_TOPK_BLOCK = 64  # B_TOPK of every sparse decode kernel (asserts topk % B_TOPK == 0)
PREFILL_TOPK_BLOCK = 128  # sm90 prefill asserts topk % (2 * B_TOPK=64); engines pad to 128
BATCH_INVARIANT = "enable_batch_invariant"
# sgl-flash-mla 1.0.0's flash_mla_interface.py asserts the switch off on the legacy half
NO_INVARIANT_SM90 = (
    "batch_invariant: enable_batch_invariant exists only in FlashMLA's 2026.09.30 kernels "
    "(sm100); the sm90 kernels (vLLM's builds, sgl-flash-mla's legacy half) have no such switch"
)
NO_INVARIANT_PREFILL = "batch_invariant is a decode-kernel switch (split-KV off); prefill has none"
# sgl-flash-mla built with FLASH_MLA_BUILD_LEGACY=0 (flash_mla.has_legacy() False)
NO_LEGACY = (
    f"sgl-flash-mla without its legacy half (has_legacy() False, no flash_mla/{LEGACY_GLOB}), "
    "the only half this adapter runs (sm90; the V3.2/V4 caches)"
)


@dataclass
class KernelOps:
    """The two ops behind one calling convention, whatever the provider.

    decode(q, kv, indices, topk_length, sink, sched, splits, extra_kv, extra_indices,
           extra_topk_length, d_v, scale, out) -> (out, lse, sched, splits)
    prefill(q, kv, indices, scale, d_v, sink, topk_length, out) -> (out, max_logits, lse, ...)
    `*_out`: whether the op writes into the `out` it is given (otherwise it allocates its own).
    """

    provider: Provider
    decode: Callable
    prefill: Callable
    decode_out: bool = True
    prefill_out: bool = True
    # decode with enable_batch_invariant=True (no split-KV), where the build has that switch
    decode_invariant: Callable | None = None


def _bind(packet, n_fixed: int, switches: dict | None = None) -> tuple[Callable, bool]:
    """Call a torch op with its first n_fixed arguments plus out_ when its schema has one;
    `switches` set later arguments by name (the schema must have them)."""
    schema = packet.default._schema
    out_name, extra = None, dict(switches or {})
    for arg in schema.arguments[n_fixed:]:
        if arg.name in ("out_", "out"):
            out_name = arg.name
        elif arg.name in extra or arg.has_default_value():
            continue
        elif str(arg.type) == "int":
            extra[arg.name] = 0  # a later switch such as indexer_topk: 0 is off
        else:
            raise Unsupported(f"{schema.name}: unknown argument {arg.name}: {arg.type}")
    op = packet.default
    if out_name is None:
        return (lambda *a: op(*a[:-1], **extra)), False
    return (lambda *a: op(*a[:-1], **extra, **{out_name: a[-1]})), True


def ops_from_namespace(namespace: str, provider: Provider) -> KernelOps:
    """KernelOps over torch.ops.<namespace>.sparse_{decode,prefill}_fwd (vLLM, sgl-kernel, file)."""
    import torch

    ns = getattr(torch.ops, namespace)
    if not (hasattr(ns, "sparse_decode_fwd") and hasattr(ns, "sparse_prefill_fwd")):
        raise Unsupported(f"torch.ops.{namespace} has no sparse_decode_fwd/sparse_prefill_fwd")
    has_switch = BATCH_INVARIANT in _argument_names(ns.sparse_decode_fwd)
    decode, decode_out = _bind(
        ns.sparse_decode_fwd, 12, {BATCH_INVARIANT: False} if has_switch else {}
    )
    prefill, prefill_out = _bind(ns.sparse_prefill_fwd, 7)
    invariant = _bind(ns.sparse_decode_fwd, 12, {BATCH_INVARIANT: True})[0] if has_switch else None
    return KernelOps(provider, decode, prefill, decode_out, prefill_out, invariant)


def _argument_names(packet) -> set[str]:
    return {arg.name for arg in packet.default._schema.arguments}


def _flash_mla_ops(build: library.Build) -> KernelOps:
    package = importlib.import_module("flash_mla")
    if hasattr(package, "has_legacy"):  # sgl-flash-mla: op libraries loaded by its import
        # its distribution is sgl-flash-mla, not flash_mla: the version is the package's own
        version = str(getattr(package, "__version__", build.version))
        if not package.has_legacy():
            raise Unsupported(f"flash_mla {version}: {NO_LEGACY}")
        prov = Provider("flash_mla (sgl-flash-mla)", version, str(package.__file__))
        return ops_from_namespace("flash_mla_legacy", prov)
    iface = importlib.import_module("flash_mla.flash_mla_interface")
    cuda = importlib.import_module("flash_mla.cuda")  # what the interface itself calls
    if not hasattr(cuda, "sparse_decode_fwd"):
        raise Unsupported(f"flash_mla {build.version} predates the sparse kernels")
    prov = Provider("flash_mla", build.version, str(getattr(cuda, "__file__", "")))
    # pybind ops: 12 positional arguments and no out_; prefill through the interface, whose
    # later parameters (indexer_topk in newer builds) have defaults
    return KernelOps(
        prov,
        lambda *a: cuda.sparse_decode_fwd(*a[:-1]),
        lambda *a: iface.flash_mla_sparse_fwd(*a[:-1]),
        decode_out=False,
        prefill_out=False,
        # the interface passes enable_batch_invariant after sm_scale (flash_mla_interface.py)
        decode_invariant=lambda *a: cuda.sparse_decode_fwd(*a[:-1], True),
    )


def _vllm_ops(build: library.Build) -> KernelOps:
    library.load_engine_library(build)
    prov = Provider("vllm._flashmla_C", build.version, build.path)
    return ops_from_namespace("_flashmla_C", prov)


def _sgl_kernel_ops(build: library.Build) -> KernelOps:
    mod = importlib.import_module("sgl_kernel.flashmla_ops")  # registers torch.ops.sgl_kernel
    prov = Provider("sgl_kernel.flashmla_ops", f"sgl-kernel {build.version}", mod.__file__)
    return ops_from_namespace("sgl_kernel", prov)


def load_file(path: str) -> KernelOps:
    """The ops of a FlashMLA library file (or its folder): whichever namespace it registers."""
    import torch

    # sgl-flash-mla's folder (flash_mla/): its sm90 kernels are the legacy half
    folder = Path(path)
    reason = legacy_reason(folder)
    if reason:
        raise Unsupported(reason)
    package = sgl_package(folder)
    legacy = sorted((package or folder).glob(LEGACY_GLOB)) if folder.is_dir() else []
    file_name = legacy[0].name if legacy else LIB_FILE
    where = str(legacy[0].parent) if legacy else path
    so, prov = library.load_op_library(where, "FlashMLA", file_name, "flashmla.lib", ENV_LIB)
    # a legacy library registers flash_mla_legacy alone (never another build's _flashmla_C)
    namespaces = ("flash_mla_legacy",) if legacy else NAMESPACES
    for namespace in namespaces:
        if hasattr(getattr(torch.ops, namespace), "sparse_decode_fwd"):
            return ops_from_namespace(namespace, prov)
    looked = ", ".join(namespaces)
    raise Unsupported(f"{so} registers no FlashMLA sparse ops (looked in {looked})")


def sgl_package(folder: Path) -> Path | None:
    """The flash_mla/ package of an sgl-flash-mla build folder (or the folder itself)."""
    if (folder / "flash_mla").is_dir():
        return folder / "flash_mla"
    return folder if folder.name == "flash_mla" and folder.is_dir() else None


def legacy_reason(folder: Path) -> str | None:
    """Why an sgl-flash-mla folder cannot run any case here: no legacy half (read, not
    loaded); None for any other folder."""
    package = sgl_package(folder)
    if package is None or any(package.glob(LEGACY_GLOB)):
        return None
    name = folder.parent.name if folder.name == "flash_mla" else folder.name
    return f"{name}: {NO_LEGACY}"


LIBRARY = library.LibrarySpec(
    name="FlashMLA",
    not_found=NOT_FOUND,
    sources=(
        library.package_source("flash_mla", "flash_mla", _flash_mla_ops),
        library.engine_source("vllm", "vllm", "", "_flashmla_C*.so", _vllm_ops),
        library.package_source("sgl-kernel", "sgl_kernel", _sgl_kernel_ops),
    ),
    load_file=load_file,
    env_var=ENV_LIB,
    kernels=(".kernels/flashmla-vllm-*/" + LIB_FILE, ".kernels/flashmla-sgl-*/flash_mla"),
)


def discover(lib_path: str | None = None) -> KernelOps:
    """An explicit library (argument or $DSV4BENCH_FLASHMLA_LIB) wins; else the first package;
    else the checkout's kernels folder (library.discover)."""
    return library.discover(LIBRARY, lib_path)


def uses_decode_kernel(case: Case) -> bool:
    return case.decode_shape is not None


def head_rule(case: Case, arch: str) -> HeadRule:
    """64 or 128 query heads; an engine (vLLM) pads decode to 64 if h <= 64 else 128, and the
    bf16 prefill to 128 on Blackwell."""
    blackwell_prefill = arch == "sm100" and not uses_decode_kernel(case)
    engine = 128 if case.num_heads > 64 or blackwell_prefill else 64
    return HeadRule("FlashMLA", (64, 128), engine)


def padded_heads(case: Case, arch: str) -> tuple[int, str | None]:
    """Query heads handed to the kernel (64 or 128), or a reason why none fits."""
    return resolve_heads(case, head_rule(case, arch))


def _info(heads: int, kernel: str, out) -> dict:
    return {"padded_heads": heads, "kernel": kernel, "out_in_place": out is not None}


def _poison(out):
    return None if out is None else (lambda: out.fill_(float("nan")))


class FlashMLA(library.LibraryBackend):
    name = "flashmla"
    description = "FlashMLA sparse MLA: FP8-cache decode kernel and bf16 sparse prefill kernel"
    archs = ("sm90", "sm100")
    ops = ("decode", "prefill")
    layouts = ("v32", "v4")
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "yes: decode lse (b, h, s_q), prefill lse and max_logits",
        "CUDA graphs": "yes: the decode schedule is made in prepare(), the call is the op",
        "batch invariance": "no by default: the split-KV schedule follows the batch; option "
        "batch_invariant (enable_batch_invariant, 2026.09.30 kernels, not sm90)",
    }
    options = {
        "lib": None,  # a FlashMLA op library (.so or its directory); None: discover()
        "batch_invariant": False,  # decode with enable_batch_invariant (no split-KV)
        # how an engine calls the sm90 prefill at 8/16/32 heads: "" pads to 64 (vLLM 0.33.0,
        # sglang); "vllm-0.34.0" runs unpadded above the SM count (POLICIES below)
        "small_heads": "",
    }

    def __init__(
        self,
        lib: str | None = None,
        ops: KernelOps | Callable | None = None,
        batch_invariant: bool = False,
        small_heads: str = "",
    ):
        self._find_with(lib, ops, discover)
        self.batch_invariant = bool(batch_invariant)
        if small_heads not in POLICIES:
            known = ", ".join(repr(p) for p in POLICIES)
            raise ValueError(f"small_heads must be one of {known}, got {small_heads!r}")
        self.small_heads = small_heads

    def build_reason(self) -> str | None:
        return super().build_reason() or (legacy_reason(Path(self.lib)) if self.lib else None)

    def v32_scale_reading(self, arch: str) -> str | None:
        return {"sm90": "bf16", "sm100": "e8m0"}.get(arch)  # how each reads the fp32 scale

    def limit_guess(self, case: Case, axis: str, arch: str) -> int | None:
        # the decode scheduler's shared memory bounds the batch (b = chunk tokens on the
        # decode-kernel route): 4*(5b+1) bytes within the opt-in limit (the 0.26.0 build)
        if arch not in ("sm90", "sm100") or case.decode_shape is None:
            return None
        batch_axis = "tokens" if case.op == "prefill" else "batch_size"
        if axis != batch_axis or (case.op == "prefill" and case.route != "decode-kernel"):
            return None
        return hardware.flashmla_sched_batch_limit(hardware.SMEM_OPTIN_SM90)

    def supports(self, case: Case, arch: str) -> str | None:
        reason = super().supports(case, arch)
        if reason:
            return reason
        if case.d_qk not in (576, 512):
            return f"FlashMLA sparse kernels take d_qk 576 (V3.2) or 512 (V4), not {case.d_qk}"
        if case.d_v != 512:
            return f"FlashMLA sparse kernels take d_v 512, not {case.d_v}"
        if case.op == "prefill" and case.route not in ROUTES:
            return f"FlashMLA has no prefill route {case.route!r} (has: {', '.join(ROUTES)})"
        if self.batch_invariant and not uses_decode_kernel(case):
            return NO_INVARIANT_PREFILL
        if self.batch_invariant and arch == "sm90":
            return NO_INVARIANT_SM90
        if uses_decode_kernel(case):
            reason = fp8_cache_reason(case, "FlashMLA's sparse decode kernels")
            if reason:
                return reason
            if case.topk <= 0:
                return "FlashMLA sparse decode needs topk > 0"
            # an extra width off the block is padded with -1 (as engines do): see _pad_extra
            if case.topk % DECODE_TOPK_BLOCK:
                return (
                    f"FlashMLA sparse decode needs topk % {DECODE_TOPK_BLOCK} == 0, got {case.topk}"
                )
            if arch == "sm90" and case.d_qk == 576 and case.extra_topk:
                return "FlashMLA's sm90 V3.2 (d_qk 576) decode kernel takes no extra cache"
        elif case.topk + case.extra_topk <= 0:
            return "FlashMLA sparse prefill needs topk + extra_topk > 0"
        # no batch limit on purpose: where the decode scheduler fails is measured, not assumed
        return padded_heads(case, arch)[1]

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        ops = self.kernel_ops()
        arch = hardware.arch_of(device)
        heads, reason = padded_heads(case, arch)
        if reason:
            raise Unsupported(reason)
        if uses_decode_kernel(case):
            return self._prepare_decode(case, inputs, ops, heads, arch)
        if not self.small_heads or arch != "sm90":
            return self._prepare_prefill(case, inputs, ops, heads)
        tokens, sms = inputs["q"].shape[0], hardware.detect(device).sm_count or 0
        if unpadded(self.small_heads, arch, case.num_heads, tokens, sms):
            heads_used = case.num_heads
        else:
            heads_used = heads
        p = self._prepare_prefill(case, inputs, ops, heads_used)
        if case.num_heads in SMALL_HEADS and sms:
            text = rule_text(case.num_heads, tokens, sms, heads)
            p.info["small_heads"] = f"{self.small_heads}: {text}"
        return p

    def _prepare_decode(self, case: Case, x: dict, ops: KernelOps, heads: int, arch: str):
        q, kv = x["q"], x["k_cache"]
        b, s_q, h, _ = q.shape
        check_cache_width(case, "k_cache", kv)
        topk_length = x.get("topk_length")
        if arch == "sm90" and case.d_qk == 576 and topk_length is not None:
            raise Unsupported("FlashMLA's sm90 V3.2 (d_qk 576) decode kernel takes no topk_length")
        qp = pad_heads(q, heads, 2)
        out = qp.new_empty((b, s_q, heads, case.d_v)) if ops.decode_out else None
        sink = pad_sink(x.get("attn_sink"), heads)
        extra, padded = _pad_extra(x, b)
        args = [
            qp,
            kv,
            x["indices"],
            topk_length,
            sink,
            None,
            None,
            *extra,
            case.d_v,
            case.scale,
            out,
        ]
        decode = ops.decode
        if self.batch_invariant:
            if ops.decode_invariant is None:
                raise Unsupported(f"{ops.provider.name}: no {BATCH_INVARIANT} switch")
            decode = ops.decode_invariant
        first = decode(*args)  # computes the schedule (and runs once)
        args[5], args[6] = first[2], first[3]
        timed = tuple(args)
        info = _info(heads, "sparse_decode_fwd", out)
        if self.batch_invariant:
            info[BATCH_INVARIANT] = True
        if padded:
            info["extra_topk_padded"] = padded
        if first[2] is not None:
            info["sched_parts"] = int(first[2].shape[0])
            info["num_splits"] = int(first[3][-1])  # cumulative per request: last = total

        def finish(raw) -> Output:
            lse = raw[1]
            if tuple(lse.shape) != (b, heads, s_q) and tuple(lse.shape) == (b, s_q, heads):
                lse = lse.transpose(1, 2)  # a build that returns (b, s_q, h)
            o, lse = raw[0][:, :, :h], lse[:, :h]
            if case.op == "prefill":  # a decode route: (T, 1) or (1, T) -> (T, h, d_v)
                return prefill_output(o, lse)
            return Output(o, lse)

        buffers = _tensors(timed)  # the schedule (args 5, 6) included: it follows the batch
        return Prepared(lambda: decode(*timed), finish, _poison(out), info, buffers=buffers)

    def _prepare_prefill(self, case: Case, x: dict, ops: KernelOps, heads: int):
        q, indices = x["q"], x["indices"]
        t, h, _ = q.shape
        if indices.shape[-1] % PREFILL_TOPK_BLOCK:
            raise Unsupported(
                f"FlashMLA sparse prefill needs an index width % "
                f"{PREFILL_TOPK_BLOCK} == 0, got {indices.shape[-1]}"
            )
        qp = pad_heads(q, heads, 1)
        out = qp.new_empty((t, heads, case.d_v)) if ops.prefill_out else None
        sink = pad_sink(x.get("attn_sink"), heads)
        args = (qp, x["kv"], indices, case.scale, case.d_v, sink, x.get("topk_length"), out)
        info = _info(heads, "sparse_prefill_fwd", out)
        # (out, max_logits, lse)
        finish = lambda raw: Output(raw[0][:, :h], raw[2][:, :h], max_logits=raw[1][:, :h])
        return Prepared(
            lambda: ops.prefill(*args), finish, _poison(out), info, buffers=_tensors(args)
        )


def _tensors(args) -> tuple:
    """The tensor arguments of a kernel call in order, None kept in its place."""
    return tuple(a for a in args if a is None or hasattr(a, "data_ptr"))


def _pad_extra(x: dict, b: int) -> tuple[list, dict | None]:
    """(extra_k_cache, extra_indices, extra_topk_length) for the decode kernel, which asserts
    extra_topk % 64 == 0. A width off the block (V4-Flash C128 at a 500K context: 3906 entries)
    is padded with -1 to the next multiple of 64, and the true width goes in as
    extra_topk_length, as vLLM and sglang do; the answer is unchanged (-1 is never read).
    Returns what was padded (for the row's info), or None."""
    import torch

    cache, idx, length = (x.get(k) for k in ("extra_k_cache", "extra_indices", "extra_topk_length"))
    width = 0 if idx is None else idx.shape[-1]
    if not width % DECODE_TOPK_BLOCK:
        return [cache, idx, length], None
    to = -(-width // DECODE_TOPK_BLOCK) * DECODE_TOPK_BLOCK
    pad = idx.new_full((*idx.shape[:-1], to - width), -1)
    idx = torch.cat([idx, pad], dim=-1).contiguous()
    if length is None:
        length = torch.full((b,), width, dtype=torch.int32, device=idx.device)
    why = "FlashMLA decode asserts extra_topk % 64 == 0: padded with -1 as engines do"
    return [cache, idx, length], {"from": width, "to": to, "extra_topk_length": width, "why": why}


# How an engine release calls FlashMLA's Hopper sparse prefill at few heads per rank.
#
# vLLM 0.34.0 (vllm/v1/attention/backends/mla/flashmla_sparse.py,
# FlashMLASparseImpl._should_use_bf16_small_head_kernel and _bf16_flash_mla_kernel): on the
# sm90 family, at 8, 16 or 32 query heads, the call runs unpadded (FlashMLA's small-head kernels,
# `launch_small_heads<512|576, ..., 16|32>`, in the same binary as 0.33.0's) when the call's tokens
# exceed the SM count times 1 (times 2 at 32 heads) - "performance heuristics, not correctness
# requirements" -, else it pads q to 64 heads (`prefill_padding = 64`) as 0.33.0 does always.

VLLM_034 = "vllm-0.34.0"
POLICIES = ("", VLLM_034)  # "": pad as the engine presets always did
SMALL_HEADS = (8, 16, 32)


def tokens_per_sm(num_heads: int) -> int:
    return 2 if num_heads == 32 else 1


def unpadded(policy: str, arch: str, num_heads: int, tokens: int, sm_count: int | None) -> bool:
    """Whether `policy` runs this prefill call at its own head count (no padding)."""
    if policy != VLLM_034 or arch != "sm90" or num_heads not in SMALL_HEADS or not sm_count:
        return False
    return tokens > sm_count * tokens_per_sm(num_heads)


def rule_text(num_heads: int, tokens: int, sm_count: int, padded_to: int) -> str:
    """What the policy did with one call, for the row's info."""
    limit = sm_count * tokens_per_sm(num_heads)
    if tokens > limit:
        return f"{num_heads} heads unpadded: {tokens} tokens > {limit} (SMs x {limit // sm_count})"
    return f"padded to {padded_to}: {tokens} tokens <= {limit} (SMs x {limit // sm_count})"
