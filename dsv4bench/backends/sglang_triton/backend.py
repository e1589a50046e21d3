"""sglang's Triton sparse MLA kernels (sglang 0.5.23), the ones engines run where FlashMLA does not
exist (sm120) and which, being Triton, run on sm90 too. Option `kernel` picks the entry point:

  sm120        flash_mla_sm120_triton.flash_mla_sparse_decode_triton: the fused tiled decode over
               the 584-byte V4 pages, one program per (token, head), fp32 throughout; the extra
               cache is a second launch merged by lse, the sink applied after (sglang's
               SGLANG_SM120_FLASHMLA_BACKEND=triton).
  sm120-torch  flash_mla_sm120.flash_mla_with_kvcache_sm120 with SGLANG_SM120_FLASHMLA_BACKEND=
               torch: its PyTorch fallback (gather, dequantize to bf16, fp32 einsum).
  dsv4-fused   dsv4/triton_sparse_decode.triton_fp8_attention_fwd: the fused gather+dequant
               Triton decode (split-K for small batches) sglang's hip_flash_mla runs under
               SGLANG_HACK_FLASHMLA_BACKEND=triton; plain Triton, e4m3fn off gfx942.
  dsa-decode   dsa/triton_sparse_mla_decode.triton_sparse_mla_decode_splitk: the V3.2 (DSA)
               split-K decode over a bf16 cache (dsa_backend._forward_triton_decode).
  dsa-prefill  dsa/triton_sparse_mla_prefill.sparse_mla_prefill: the V3.2 bf16 sparse prefill
               (--dsa-prefill-backend triton_sparse_mla), option `union` as --dsa-triton-union.

The calls are sglang's (call.py). The V4 entries take the FP8 cache as it is (decode, and a
prefill chunk on route decode-kernel: sglang's DSv4 path); the DSA entries a bf16 pool of every
slot, as sglang keeps a bf16 cache for them. Tolerance: the case's (FlashMLA's): the V4 Triton
kernels dequantize exactly and accumulate in fp32 with a bf16 output (rounded once more by the
extra-cache merge and the sink), the DSA kernels multiply bf16 tiles into fp32 as FlashMLA does.
The sm120 kernel's lse with a sink is logaddexp(keys' lse, sink), not the oracle's keys-only lse,
and dsa-* return none: those rows judge the output only (info["lse"] says why).

Where the files come from: option `lib` (a `sglang-triton-<v>` build folder), else
$DSV4BENCH_SGLANG_TRITON_LIB, else the kernels folder's newest build; loaded by sources.py.
"""

from __future__ import annotations

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
    resolve_heads,
)
from dsv4bench.backends.sglang_triton import call, sources
from dsv4bench.backends.toolchains import library
from dsv4bench.cases.case import Case

ENV_LIB = library.lib_env("sglang-triton")
BUILD_GLOB = ".kernels/sglang-triton-*/"
FETCH_HINT = "dsv4bench kernels fetch sglang"
NOT_FOUND = (
    f"sglang's Triton sparse MLA files not found: {FETCH_HINT}, or pass "
    f"--backend-opt sglang-triton.lib=FOLDER (or {ENV_LIB})"
)
# sglang's dsa_backend refuses triton_sparse_mla above this many heads per rank
# (_TRITON_SPARSE_MLA_MAX_HEADS: "validated up to")
DSA_PREFILL_MAX_HEADS = 32
UNIONS = (0, 2, 4)


@dataclass(frozen=True)
class Entry:
    """One sglang entry point: the file, the function, what it reads."""

    file: str
    function: str
    layout: str  # the suite's cache layout the call reads
    ops: tuple[str, ...]
    lse: str  # "keys": the oracle's lse; "sink-folded": keys' lse unless a sink; "none"


ENTRIES = {
    "sm120": Entry(
        "flash_mla_sm120_triton.py",
        "flash_mla_sparse_decode_triton",
        "v4",
        ("decode", "prefill"),
        "sink-folded",
    ),
    "sm120-torch": Entry(
        "flash_mla_sm120.py", "flash_mla_with_kvcache_sm120", "v4", ("decode", "prefill"), "keys"
    ),
    "dsv4-fused": Entry(
        sources.DSV4_PACKAGE, "triton_fp8_attention_fwd", "v4", ("decode", "prefill"), "keys"
    ),
    "dsa-decode": Entry(
        "dsa/triton_sparse_mla_decode.py",
        "triton_sparse_mla_decode_splitk",
        "v32",
        ("decode",),
        "none",
    ),
    "dsa-prefill": Entry(
        "dsa/triton_sparse_mla_prefill.py", "sparse_mla_prefill", "v32", ("prefill",), "none"
    ),
}


@dataclass
class SglangTritonOps:
    provider: Provider
    fn: Callable


def build_folder(lib: str | None) -> Path | None:
    """The build folder the chain picks: `lib`, $ENV_LIB, the kernels folder's newest."""
    pattern = BUILD_GLOB.removeprefix(".kernels/")
    return library.build_folder(lib, ENV_LIB, pattern, lambda folder: folder, lambda: None)


def missing_reason(lib: str | None) -> str | None:
    """Why the files cannot load, known without importing them; None if they are there."""
    folder = build_folder(lib)
    if folder is None:
        return NOT_FOUND
    if not folder.is_dir():
        return f"sglang Triton build not found: no folder {folder} ({FETCH_HINT})"
    gone = sources.missing_files(folder)
    if gone:
        return f"sglang Triton build {folder} lacks {', '.join(gone)} ({FETCH_HINT})"
    return None


_LOADERS: dict[str, sources.Loader] = {}


def load_entry(lib: str | None, kernel: str) -> SglangTritonOps:
    reason = missing_reason(lib)
    if reason:
        raise Unsupported(reason)
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise Unsupported("sglang's Triton kernels need triton (pip install triton)") from e
    folder = build_folder(lib)
    loader = _LOADERS.setdefault(str(folder.resolve()), sources.Loader(folder))
    entry = ENTRIES[kernel]
    module = loader.module(entry.file)
    fn = getattr(module, entry.function, None)
    if fn is None:
        raise Unsupported(f"sglang's {entry.file} has no {entry.function} (another sglang API?)")
    where = str((folder / entry.file).resolve())
    return SglangTritonOps(
        Provider(f"sglang {entry.function}", sources.version_of(folder), where), fn
    )


def head_rule(case: Case, entry: Entry) -> HeadRule:
    """Any head count; sglang's V4 backend pads q to 64 heads (128 above 64) for the decode
    kernels, its DSA backend passes the rank's heads as they are."""
    if entry.layout == "v4":
        return HeadRule("sglang Triton V4 decode", None, 128 if case.num_heads > 64 else 64)
    return HeadRule("sglang Triton DSA", None, case.num_heads)


class SglangTriton(library.LibraryBackend):
    name = "sglang-triton"
    description = "sglang's Triton sparse MLA kernels (sm120 V4 decode, V3.2 DSA decode/prefill)"
    archs = ("sm90", "sm120")
    ops = ("decode", "prefill")
    layouts = ("v32", "v4")
    options = {"lib": None, "kernel": "sm120", "union": 0}
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "sm120 only, keys-only where no sink (with a sink it returns logaddexp(lse, "
        "sink)); the DSA kernels return none",
        "CUDA graphs": "yes: index padding and lengths made in prepare(), the call is the op",
        "batch invariance": "not promised: the sm120 page split and DSA split-k follow the batch",
    }

    def __init__(self, lib: str | None = None, kernel: str = "sm120", union: int = 0, ops=None):
        """lib: a `sglang-triton-<v>` build folder (None: discover). kernel: an ENTRIES name.
        union: sparse_mla_prefill's union (dsa-prefill). ops: injected SglangTritonOps."""
        if kernel not in ENTRIES:
            raise ValueError(f"kernel {kernel!r} (one of {', '.join(ENTRIES)})")
        if union not in UNIONS:
            raise ValueError(f"union {union} (one of {', '.join(map(str, UNIONS))})")
        self.kernel, self.union = kernel, int(union)
        self._missing: dict[str | None, str | None] = {}
        self._find_with(lib, ops, lambda found: load_entry(found, self.kernel))

    @property
    def entry(self) -> Entry:
        return ENTRIES[self.kernel]

    def build_reason(self) -> str | None:
        if self._found.loaded:
            return None
        if self.lib not in self._missing:
            self._missing[self.lib] = missing_reason(self.lib)
        return self._missing[self.lib]

    def supports(self, case: Case, arch: str) -> str | None:
        return super().supports(case, arch) or self.case_reason(case) or self.build_reason()

    def case_reason(self, case: Case) -> str | None:
        """Why the entry point cannot take this case whatever is installed; None if it can."""
        entry, who = self.entry, f"sglang's {self.entry.function}"
        if case.op not in entry.ops:
            return f"{who} ({self.kernel}) has no {case.op} path (has: {', '.join(entry.ops)})"
        if case.layout != entry.layout:
            model = "V4 584-byte" if entry.layout == "v4" else "V3.2 (DSA, d_qk 576)"
            return f"{who} reads the {model} cache, not layout {case.layout}"
        if case.d_v != 512:
            return f"{who} returns d_v 512 (the latent), not {case.d_v}"
        if case.topk <= 0:
            return f"{who} needs topk > 0"
        reason = self._v4_reason(case) if entry.layout == "v4" else self._dsa_reason(case)
        return reason or resolve_heads(case, head_rule(case, entry))[1]

    def _v4_reason(self, case: Case) -> str | None:
        if case.op == "prefill" and case.route != "decode-kernel":
            return (
                f"sglang runs its V4 Triton decode kernels on prefill chunks as T requests of "
                f"one token (route decode-kernel), not route {case.route}"
            )
        return fp8_cache_reason(case, f"sglang's {self.entry.function}")

    def _dsa_reason(self, case: Case) -> str | None:
        who = f"sglang's {self.entry.function}"
        if case.sink:
            return f"{who} takes no attention sink"
        if case.extra_topk:
            return f"{who} reads one cache (no extra cache)"
        if case.op == "prefill":
            if case.route != "sparse-prefill":
                return f"{who} is the bf16 sparse prefill (route sparse-prefill), not {case.route}"
            heads = resolve_heads(case, head_rule(case, self.entry))[0]
            if heads > DSA_PREFILL_MAX_HEADS:
                return (
                    f"sglang's dsa_backend takes triton_sparse_mla up to {DSA_PREFILL_MAX_HEADS} "
                    f"query heads per rank (_TRITON_SPARSE_MLA_MAX_HEADS), not {heads}"
                )
            return None
        return fp8_cache_reason(case, "this backend's bf16 pool conversion")

    def prepare_reason(self, case: Case, device: str) -> str | None:
        return self.case_reason(case)

    def prepare_case(self, case: Case, inputs: dict, device: str) -> Prepared:
        heads = resolve_heads(case, head_rule(case, self.entry))[0]
        fn = self.kernel_ops().fn
        if self.entry.layout == "v4":
            return self._prepare_v4(case, inputs, fn, heads)
        return self._prepare_dsa(case, inputs, fn, heads)

    def _info(self, heads: int) -> dict:
        return {"kernel": f"sglang {self.entry.function} ({self.kernel})", "padded_heads": heads}

    def _prepare_v4(self, case: Case, x: dict, fn, heads: int) -> Prepared:
        check_cache_width(case, "k_cache", x["k_cache"])
        kwargs = call.v4_kwargs(case, x, heads)
        info = self._info(heads)
        info["index_width"] = kwargs["indices"].shape[-1]
        lse = self.entry.lse
        if lse == "sink-folded":
            lse = "keys" if kwargs["attn_sink"] is None else "none"
            if lse == "none":
                info["lse"] = "the kernel returns logaddexp(lse, sink), not the keys' lse"
        if self.kernel == "sm120":
            args = [kwargs[k] for k in ("q", "k_cache", "indices", "topk_length", "attn_sink")]
            args += [kwargs["head_dim_v"], kwargs["softmax_scale"], kwargs["extra_k_cache"]]
            args += [kwargs["extra_indices_in_kvcache"], kwargs["extra_topk_length"]]
            run = lambda: fn(*args)  # noqa: E731 - positional, as the sm120 dispatcher calls it
        else:
            run = lambda: fn(**kwargs)  # noqa: E731
            args = list(kwargs.values())
        run()  # Triton compiles (and autotunes) on the first call, outside the timed one
        buffers = tuple(a for a in args if a is None or hasattr(a, "data_ptr"))
        return Prepared(run, call.v4_finish(case, lse), None, info, buffers=buffers)

    def _prepare_dsa(self, case: Case, x: dict, fn, heads: int) -> Prepared:
        rows = call.dsa_rows(case, x, heads)
        q, kv, idx = rows["q"], rows["kv"], rows["indices"]
        info = self._info(heads)
        info["kv_dtype"] = "bf16"
        info["lse"] = "not returned by the kernel"
        if self.kernel == "dsa-decode":
            workspace: list = []  # the backend's grow-only split-K buffers
            q_nope, q_rope = q[..., : case.d_v], q[..., case.d_v :]
            kw = dict(q_nope=q_nope, q_rope=q_rope, kv=kv, indices=idx.unsqueeze(1))
            kw.update(sm_scale=case.scale, d_v=case.d_v, workspace=workspace)
            run = lambda: fn(**kw)  # noqa: E731
        else:
            kw = dict(topk_length=rows["topk_length"], union=self.union)
            run = lambda: fn(q, kv, idx, case.scale, case.d_v, **kw)  # noqa: E731
            info["union"] = self.union
        run()
        return Prepared(run, call.dsa_finish(case), None, info)
