"""sglang's `tilelang` DSA backend (--dsa-prefill-backend / --dsa-decode-backend tilelang): its
TileLang sparse MLA kernel over a bf16 KV cache, prefill and decode through one call
(call.py), V3.2 only.

The kernel (sglang 0.5.23 kernels/ops/attention/dsa/tilelang_kernel.py): tilelang_sparse_fwd
picks sparse_attention_fwd_kernel_v2 for a bf16 cache with a rope tail (d_qk 576 = d_v 512 +
tail 64) on CUDA. Its limits, asserted when TileLang builds it, are the plan-time reasons here:
the index width is a multiple of 64 (sglang pads to it) holding an even number of 64-entry blocks
("NI should be a multiple of 2"); more than 64 heads come in blocks of 64 ("head_kv should be a
multiple of 64"), fewer are padded inside the kernel to max(16, the next power of two); d_v and
the tail are powers of two. No lse, no attention sink, no extra cache.

V4: sglang runs V4 through TileLang only as an FP8 kernel on ROCm (kernels/ops/attention/dsv4/
tilelang_fp8_attention.py, called from srt/layers/attention/hip_flash_mla.py), never this bf16
kernel, so V4 cases are unsupported with that reason.

Where the parts come from: the kernel file by library.py's chain (the `lib` option: a
`tilelang-sglang-<v>` build folder or the file itself; $DSV4BENCH_TILELANG_LIB; an installed
sglang's file; the kernels folder's newest build); TileLang and its requirements by runtime.py
(the `runtime` option, an installed tilelang, or the kernels folder's runtime and deps builds).
What is missing is one line, known without importing anything, and every row of the backend is
unsupported with it.

Checked on a CPU with TileLang 0.1.15 (docs/kernel-facts.md, TileLang): the factory's asserts,
by tracing it at 1-128 heads and widths 64-2048; the guarded loads of the padded heads, in the
CUDA it lowers for sm_90a. NOT run here: the kernel itself (no GPU on the machine this adapter
was written on); the CPU tests use a fake kernel that checks sglang's argument contract and
computes the answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dsv4bench.backends.base import (
    HeadRule,
    Prepared,
    Provider,
    Unsupported,
    fp8_cache_reason,
    resolve_heads,
)
from dsv4bench.backends.tilelang import call, runtime
from dsv4bench.backends.toolchains import library
from dsv4bench.cases.case import ROUTES, Case

ENV_LIB = library.lib_env("tilelang")
KERNEL_FILE = "tilelang_kernel.py"
DEFAULT_GLOB = ".kernels/tilelang-sglang-*/" + KERNEL_FILE
NOT_FOUND = (
    f"sglang's {KERNEL_FILE} not found: dsv4bench kernels fetch sglang, install sglang, or "
    f"pass --backend-opt tilelang.lib=PATH (or {ENV_LIB})"
)
HEAD_BLOCK = 64  # more heads than this come in blocks of it
PREFILL_INDEX_PAD = 128  # the suite's sparse-prefill inputs pad index rows to it
V4_REASON = (
    "sglang runs V4 through TileLang only as an FP8 kernel on ROCm (dsv4/"
    "tilelang_fp8_attention.py); its CUDA tilelang path is the V3.2 bf16 kernel (d_qk 576)"
)


@dataclass
class TileLangOps:
    """sglang's entry point, called with sglang's keyword names."""

    provider: Provider
    sparse_fwd: Callable  # tilelang_sparse_fwd(q, kv, indices, sm_scale, d_v) -> (1, T, h, d_v)


def kernel_file(path: str | Path) -> Path:
    """The kernel file a `lib` names: itself, or KERNEL_FILE in the build folder it names."""
    p = Path(path).expanduser()
    return p if p.suffix == ".py" else p / KERNEL_FILE


def _sglang_version(file: Path) -> str:
    """`sglang 0.5.23` from the build.json beside a fetched file; else what the file is."""
    try:
        build = json.loads((file.parent / "build.json").read_text())
        return f"{build['package']} {build['version']}"
    except (OSError, ValueError, KeyError):
        return f"file {file.name}"


def _ops(file: Path, version: str) -> TileLangOps:
    if not file.is_file():
        raise Unsupported(f"{NOT_FOUND} (no {file})")
    module = runtime.load_kernel_file(file)
    fwd = getattr(module, "tilelang_sparse_fwd", None)
    if fwd is None:
        raise Unsupported(f"{file} has no tilelang_sparse_fwd (another sglang API?)")
    return TileLangOps(Provider("sglang tilelang_sparse_fwd", version, str(file.resolve())), fwd)


LIBRARY = library.LibrarySpec(
    name="sglang TileLang kernels",
    not_found=NOT_FOUND,
    sources=(
        library.engine_source(
            "sglang",
            "sglang",
            "kernels/ops/attention/dsa",
            KERNEL_FILE,
            lambda b: _ops(Path(b.path), b.version),
        ),
    ),
    load_file=lambda path: _ops(kernel_file(path), _sglang_version(kernel_file(path))),
    env_var=ENV_LIB,
    kernels=(DEFAULT_GLOB,),
    load_kernels=lambda b: _ops(Path(b.path), _sglang_version(Path(b.path))),
)


def missing_parts(lib: str | None, runtime_option: str | None) -> list[str]:
    """What the backend lacks, without importing anything: TileLang's parts, nvcc, the file."""
    gone = runtime.missing(runtime.find_runtime(runtime_option))
    if lib and not kernel_file(lib).is_file():
        gone.append(f"{kernel_file(lib)} (dsv4bench kernels fetch sglang)")
    elif not lib and not library.find_builds(LIBRARY):
        gone.append(f"sglang's {KERNEL_FILE} (dsv4bench kernels fetch sglang, or install sglang)")
    return gone


def discover(lib: str | None = None, runtime_option: str | None = None) -> TileLangOps:
    """TileLang imported from its runtime, then sglang's kernel file loaded (library.discover);
    Unsupported naming everything missing when anything is."""
    gone = missing_parts(lib, runtime_option)
    if gone:
        raise Unsupported(f"TileLang backend: missing {'; '.join(gone)}")
    found = runtime.find_runtime(runtime_option)
    tilelang = runtime.import_tilelang(found)
    ops = library.discover(LIBRARY, lib)
    on = f"tilelang {getattr(tilelang, '__version__', 'unknown')} ({found.label})"
    return replace(ops, provider=replace(ops.provider, version=f"{ops.provider.version} on {on}"))


def padded_heads(case: Case) -> tuple[int, str | None]:
    """Heads handed to the kernel: as sglang passes them (unpadded), or head_padding's count;
    above HEAD_BLOCK only whole blocks of it."""
    heads, reason = resolve_heads(case, HeadRule("TileLang sparse MLA", None, case.num_heads))
    if not reason and heads > HEAD_BLOCK and heads % HEAD_BLOCK:
        reason = (
            f"sglang's TileLang kernel takes up to {HEAD_BLOCK} heads or a multiple of "
            f"{HEAD_BLOCK}, not {heads}"
        )
    return heads, reason


def index_width(case: Case) -> int:
    """The index row width the kernel gets: the case's top-k (the sparse-prefill inputs pad it
    to 128), padded as sglang pads it."""
    width = case.topk if case.decode_shape is not None else call.round_up(case.topk, 128)
    return call.round_up(width, call.INDEX_BLOCK)


class TileLang(library.LibraryBackend):
    name = "tilelang"
    description = "sglang's TileLang sparse MLA kernel (bf16 KV, V3.2), prefill and decode"
    archs = ("sm90",)
    ops = ("decode", "prefill")
    layouts = ("v32",)
    options = {"lib": None, "runtime": None}
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "no: the kernel writes none",
        "CUDA graphs": "yes: compiled and its operands made in prepare(), the call launches",
        "batch invariance": "not promised: never checked",
    }

    def __init__(self, lib: str | None = None, runtime: str | None = None, ops=None):
        """lib: sglang's kernel file or its build folder (None: discover). runtime: a
        `tilelang-runtime-<v>` build folder (None: installed tilelang, else the kernels
        folder's). ops: injected TileLangOps (or a factory) instead of loading anything."""
        self._runtime = runtime
        self._missing: dict[tuple, str | None] = {}  # (lib, runtime) -> missing_reason
        self._find_with(lib, ops, lambda found: discover(found, self._runtime))

    @property
    def runtime(self) -> str | None:
        return self._runtime

    @runtime.setter
    def runtime(self, value: str | None) -> None:
        self._runtime = value
        self._found.reset()

    def process_key(self) -> str:
        key = super().process_key()
        return f"{key or self.base}.runtime={self._runtime}" if self._runtime else key

    def missing_reason(self) -> str | None:
        """Why the backend cannot load, known without importing (None: nothing missing, or
        its ops are at hand)."""
        if self._found.loaded:
            return None
        key = (self.lib, self._runtime)
        if key not in self._missing:
            gone = missing_parts(*key)
            self._missing[key] = f"TileLang backend: missing {'; '.join(gone)}" if gone else None
        return self._missing[key]

    def build_reason(self) -> str | None:
        return self.missing_reason()

    def supports(self, case: Case, arch: str) -> str | None:
        if arch in self.archs and case.op in self.ops and case.layout == "v4":
            return V4_REASON  # rather than the layout declaration's plain refusal
        return super().supports(case, arch) or self.case_reason(case) or self.missing_reason()

    def case_reason(self, case: Case) -> str | None:
        """Why the kernel cannot take this case whatever is installed; None if it can."""
        if case.layout == "v4":
            return V4_REASON
        if case.d_qk != call.D_QK:
            return f"sglang's TileLang kernel takes d_qk 576 (V3.2), not {case.d_qk}"
        if case.d_v != call.D_V:
            return f"sglang's TileLang kernel returns d_v 512 (the latent), not {case.d_v}"
        if case.sink:
            return "sglang's TileLang kernel takes no attention sink"
        if case.extra_topk:
            return "sglang's TileLang kernel reads one cache (no extra cache)"
        if case.op == "prefill" and case.route not in ROUTES:
            return f"no prefill route {case.route!r} (has: {', '.join(ROUTES)})"
        if case.decode_shape is not None:
            reason = fp8_cache_reason(case, "this backend's bf16 pool conversion")
            if reason:
                return reason
        if case.topk <= 0:
            return "sglang's TileLang kernel needs topk > 0"
        blocks = index_width(case) // call.INDEX_BLOCK
        if blocks % 2:
            return (
                f"sglang pads topk {case.topk} to {index_width(case)}, {blocks} blocks of "
                f"{call.INDEX_BLOCK}; its TileLang kernel takes an even number of blocks"
            )
        return padded_heads(case)[1]

    def prepare_reason(self, case: Case, device: str) -> str | None:
        return self.case_reason(case)

    def prepare_case(self, case: Case, inputs: dict, device: str) -> Prepared:
        heads = padded_heads(case)[0]
        return call.prepare_call(case, inputs, device, self.kernel_ops().sparse_fwd, heads)
