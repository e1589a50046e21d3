"""DeepGEMM's lightning-indexer kernels, both forms, through its Python API. The signatures of
DeepGEMM 2.5.0 (the vLLM 0.26.0 wheel's vllm/third_party/deep_gemm), printed on the H100:

  get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None) -> schedule
  fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                       max_context_len, clean_logits=False, indices=None) -> logits
  fp8_mqa_logits(q, kv: (kv, scales), weights, cu_seq_len_k_start, cu_seq_len_k_end,
                 clean_logits=True, max_seqlen_k=0) -> logits

2.5.0 asserts `context_lens.dim() == 2` (one length per query row, (batch, next_n)): a V3.2
case's 1-D lengths (causal over the last next_n positions) become the per-row counts the oracle
sees (reference.indexer.paged_visible). The older API this adapter was first written against
(DeepGEMM's README then) is get_paged_mqa_logits_metadata(context_lens, num_sms) with 1-D or
2-D lengths; both are recognised from the function's signature (its pybind docstring), and
any other is refused with the signature in the reason.

q, kv e4m3; kv_cache the (blocks, block_size, 1, D + 4) uint8 cache; weights fp32. The schedule
(and the 2-D lengths) are computed in prepare(), not timed: engines compute them once per batch
in their metadata builder. Top-k is torch.topk, as for the Triton backend. DeepGEMM is the
`deep_gemm` module (DeepGEMM itself, sgl-deep-gemm, or vLLM's bundled copy found as
`vllm.third_party.deep_gemm`), else the checkout's .kernels/deepgemm-vllm-*.tar.xz (unpacked
once outside the checkout, as tools/gpu/setup.sh does): library.py's chain.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import tarfile
from pathlib import Path

from dsv4bench.backends import library
from dsv4bench.backends.base import Backend, LazyOps, Prepared, Provider, Unsupported
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

NOT_FOUND = "DeepGEMM not importable (deep_gemm)"
PACKED_GLOB = ".kernels/deepgemm-vllm-*.tar.xz"  # tools/gpu/pack.sh's copy
API_V25 = "context_lens, block_kv, num_sms"  # 2.5.0: 2-D lengths, the cache's block size
API_OLD = "context_lens, num_sms"


def params(fn) -> tuple[str, ...] | None:
    """A function's parameter names: from inspect, else from a pybind docstring's first line
    `name(a: T, b: T = x) -> R`; None if neither says."""
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        pass
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    m = re.match(r"\s*\w+\((.*)\)\s*->", doc[0]) if doc else None
    if not m:
        return None
    return tuple(re.findall(r"(?:^|,\s*)(\w+)\s*:", m.group(1)))


def metadata_api(dg) -> str:
    """Which get_paged_mqa_logits_metadata this DeepGEMM has: API_V25 or API_OLD."""
    names = params(dg.get_paged_mqa_logits_metadata)
    if names and names[:3] == ("context_lens", "block_kv", "num_sms"):
        return API_V25
    if names and names[:2] == ("context_lens", "num_sms"):
        return API_OLD
    version = getattr(dg, "__version__", "?")
    shown = ", ".join(names) if names else "unknown"
    raise Unsupported(
        f"DeepGEMM {version}: unknown get_paged_mqa_logits_metadata({shown}) "
        f"(known: ({API_V25}) or ({API_OLD}))"
    )


def _module_source(name: str) -> library.Source:
    """`deep_gemm` importable as `name` (a missing module is absent, with its note)."""
    kind = "engine" if name.startswith("vllm.") else "package"

    def locate() -> list[library.Build]:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise library.Absent(f"{name}: {e}") from e
        where, version = getattr(module, "__file__", ""), getattr(module, "__version__", "")
        return [library.Build(kind, name, where or "", version)]

    return library.Source(kind, name, locate, lambda build: importlib.import_module(name))


def _from_kernels(build: library.Build):
    """deep_gemm from the kernels folder's tarball, unpacked once, put first on sys.path."""
    try:
        folder = library.unpack_tar(Path(build.path), "deep_gemm/__init__.py")
    except (OSError, tarfile.TarError) as e:
        raise Unsupported(f"{NOT_FOUND}: cannot unpack {PACKED_GLOB}: {e}"[:300]) from e
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("deep_gemm")
    except Exception as e:
        raise Unsupported(f"{NOT_FOUND} from {folder}: {type(e).__name__}: {e}"[:300]) from e


LIBRARY = library.LibrarySpec(
    name="DeepGEMM",
    not_found=NOT_FOUND,
    sources=(_module_source("deep_gemm"), _module_source("vllm.third_party.deep_gemm")),
    kernels=(PACKED_GLOB,),
    load_kernels=_from_kernels,
    strict=True,  # installed but failing to import (an ABI mismatch): that reason is the answer
)


def discover():
    """The deep_gemm module: DeepGEMM itself (or sgl-deep-gemm), vLLM's bundled copy, or the
    checkout's kernels folder (library.discover)."""
    return library.discover(LIBRARY)


class DeepGEMM(Backend):
    name = "deepgemm"
    description = "DeepGEMM fp8_paged_mqa_logits / fp8_mqa_logits (the indexer), top-k by torch"
    archs = ("sm90", "sm100")
    ops = ("indexer",)
    layouts = ()  # the indexer's own key cache, no attention cache

    def __init__(self, module=None):
        self._found = LazyOps(module, discover)

    def provider(self) -> Provider:
        dg = self._found.get()
        return Provider("deep_gemm", getattr(dg, "__version__", ""), getattr(dg, "__file__", ""))

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        from reference.indexer import topk_indices

        dg = self._found.get()
        if "kv" in inputs:
            logits, info = _ragged(dg, inputs)
        else:
            logits, info = _paged(dg, case, inputs)

        def run():
            out = logits()
            return out, topk_indices(out, case.topk)

        info["topk"] = "torch.topk"
        return Prepared(run=run, finish=lambda raw: Output(raw[0], None, raw[1]), info=info)


def _ragged(dg, x: dict):
    def logits():
        kv = (x["kv"], x["kv_scales"])
        return dg.fp8_mqa_logits(x["q"], kv, x["weights"], x["ks"], x["ke"])

    return logits, {"kernel": "fp8_mqa_logits"}


def _paged(dg, case: Case, x: dict):
    import torch

    from dsv4bench.cases import indexer_case
    from reference.indexer import paged_visible

    api = metadata_api(dg)
    lens = x["context_lens"]
    cache = x["kv_cache"]  # uint8 (blocks, block_size, 1, D + 4), as DeepGEMM's tests
    b, next_n = x["q"].shape[:2]
    if api == API_V25:
        if lens.dim() == 1:  # per query row: what the 1-D causal rule gives each row
            lens = paged_visible(lens, next_n).view(b, next_n).to(lens.dtype).contiguous()
        sched = dg.get_paged_mqa_logits_metadata(lens, cache.shape[1], dg.get_num_sms())
    else:
        sched = dg.get_paged_mqa_logits_metadata(lens, dg.get_num_sms())
    max_len = indexer_case.keys(case)
    # 2.5.0 refuses clean_logits with 2-D lengths ("not is_context_lens_2d"): the keys past a
    # row's length hold whatever was in memory, so they are masked after the call, inside the
    # timed call (an engine's length-aware top-k skips them instead)
    clean = api == API_OLD
    past = None
    if not clean:
        cols = torch.arange(max_len, device=lens.device)
        past = cols[None, :] >= lens.reshape(-1, 1)

    def logits():
        out = dg.fp8_paged_mqa_logits(
            x["q"], cache, x["weights"], lens, x["block_table"], sched, max_len, clean_logits=clean
        )
        if past is not None:
            out.masked_fill_(past, float("-inf"))
        return out

    info = {
        "kernel": "fp8_paged_mqa_logits",
        "metadata_api": f"get_paged_mqa_logits_metadata({api})",
        "context_lens": "2-D" if lens.dim() == 2 else "1-D",
        "clean_logits": "by the kernel" if clean else "masked after the call, timed",
        "schedule_entries": int(sched.numel()) if hasattr(sched, "numel") else None,
    }
    return logits, info
