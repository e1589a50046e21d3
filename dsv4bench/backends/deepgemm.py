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
once outside the checkout): library.py's chain.

DeepGEMM 2.8.1 (the vLLM 0.33.0 wheel's copy) renamed both forms and changed them, read from its
`_C.py` and the op schemas in its `_C_extension.abi3.so`:

  get_paged_mqa_logits_metadata(Tensor context_lens, int block_kv, int num_sms, Tensor? indices)
  fp8_fp4_paged_mqa_logits(q: (values, scales or None), kv_cache, weights, context_lens,
                           block_table, schedule_meta, max_context_len, indices=None)
  fp8_fp4_mqa_logits(q: (values, scales or None), kv: (kv, scales), weights,
                     cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k, schedule_meta=None)

q travels as (q, None) for FP8 (the per-token scale is folded into the weights on sm90), the
paged form's tail past a row's length is not cleaned (masked after the call, timed, as for
2.5.0), and the ragged form returns compressed rows: row i holds keys [ks[i], ke[i]) from column
0, so top-k runs over the compressed row (timed) and its indices are shifted by ks; the full
(S, N) logits are laid out again only for the comparison, untimed. On sm90 the paged kernel takes
next_n 1, 2 and 4 (2.5.0 too: both assert it; vLLM 0.33.0 `native_next_n_supported`), and at
next_n 4 schedules one task per 2-CTA cluster: the metadata gets half the SMs as vLLM passes it.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import tarfile
from pathlib import Path

from dsv4bench.backends.base import (
    Backend,
    Prepared,
    Provider,
    Unsupported,
)
from dsv4bench.backends.toolchains import library
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

NOT_FOUND = "DeepGEMM not importable (deep_gemm)"
PACKED_GLOB = ".kernels/deepgemm-vllm-*.tar.xz"  # an older packing's tarball
API_V25 = "context_lens, block_kv, num_sms"  # 2.5.0: 2-D lengths, the cache's block size
API_OLD = "context_lens, num_sms"
API_V28 = "fp8_fp4"  # 2.8.1: fp8_fp4_(paged_)mqa_logits, q as (values, scales)
SM90_NEXT_N = (1, 2, 4)  # what the sm90 paged kernel takes (2.5.0 and 2.8.1)


def params(fn) -> tuple[str, ...] | None:
    """A function's parameter names: from inspect, else from a pybind docstring's first line
    `name(a: T, b: T = x) -> R`; None if neither says."""
    # a torch op (2.8.1): inspect would answer (*args, **kwargs), so its schema comes first
    schema = getattr(getattr(fn, "default", None), "_schema", None)
    if schema is not None:
        return tuple(a.name for a in schema.arguments)
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        pass
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    m = re.match(r"\s*\w+\((.*)\)\s*->", doc[0]) if doc else None
    if not m:
        return None
    return tuple(re.findall(r"(?:^|,\s*)(\w+)\s*:", m.group(1)))


def parameters(fn) -> list[tuple[str, bool]] | None:
    """(name, has a default) of a function's parameters: its torch op schema, else inspect,
    else a pybind docstring's first line; None if none says."""
    schema = getattr(getattr(fn, "default", None), "_schema", None)
    if schema is not None:
        return [(a.name, a.has_default_value()) for a in schema.arguments]
    try:
        sig = inspect.signature(fn).parameters.values()
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig):
            return [(p.name, p.default is not p.empty) for p in sig]
    except (TypeError, ValueError):
        pass
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    m = re.match(r"\s*\w+\((.*)\)\s*->", doc[0]) if doc else None
    if not m:
        return None
    return [(n, bool(d)) for n, d in re.findall(r"(?:^|,\s*)(\w+)\s*:[^,=]*(=)?", m.group(1))]


# what the adapter passes each logits function positionally (the kernels of 2.5.0 and 2.8.1)
CALLS = {
    "fp8_fp4_paged_mqa_logits": "q, kv_cache, weights, context_lens, block_table, schedule_meta, "
    "max_context_len",
    "fp8_fp4_mqa_logits": "q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k",
}


def call_reason(dg, name: str) -> str | None:
    """Why the adapter's call of `name` does not fit this build's signature, naming the first
    argument that breaks it: one it passes that the function lacks, or one the function
    requires that it does not pass; None when it fits or the signature cannot be read."""
    passed = CALLS[name].split(", ")
    found = parameters(getattr(dg, name))
    if found is None:
        return None
    version = getattr(dg, "__version__", "?")
    if len(found) < len(passed):
        return (
            f"DeepGEMM {version}: {name} takes {len(found)} arguments, the adapter passes "
            f"{len(passed)} (no argument {len(found) + 1}, {passed[len(found)]})"
        )
    for i, (arg, has_default) in enumerate(found[len(passed) :], len(passed) + 1):
        if not has_default:
            return (
                f"DeepGEMM {version}: {name} requires argument {i} {arg}, which the adapter "
                f"does not pass (it passes {CALLS[name]})"
            )
    return None


def indexer_api(dg) -> str:
    """Which indexer API this DeepGEMM has: API_V28, API_V25 or API_OLD; Unsupported (with the
    version and the missing name) for any other."""
    version = getattr(dg, "__version__", "?")
    # 2.5.0 has both names: it keeps the fp8_ forms this adapter was first verified with
    legacy = hasattr(dg, "fp8_paged_mqa_logits") and hasattr(dg, "fp8_mqa_logits")
    if not legacy and (
        hasattr(dg, "fp8_fp4_paged_mqa_logits") or hasattr(dg, "fp8_fp4_mqa_logits")
    ):
        for name in ("fp8_fp4_paged_mqa_logits", "fp8_fp4_mqa_logits"):
            if not hasattr(dg, name):
                raise Unsupported(f"DeepGEMM {version}: has fp8_fp4 logits but no {name}")
        if metadata_api(dg) != API_V25:
            raise Unsupported(f"DeepGEMM {version}: fp8_fp4 logits with an older metadata API")
        for name in CALLS:
            reason = call_reason(dg, name)
            if reason:
                raise Unsupported(reason)
        return API_V28
    for name in ("fp8_paged_mqa_logits", "fp8_mqa_logits"):
        if not hasattr(dg, name):
            raise Unsupported(
                f"DeepGEMM {version}: no {name} nor fp8_fp4_{name.removeprefix('fp8_')} "
                "(known APIs: 2.5.0, 2.8.1)"
            )
    return metadata_api(dg)


def metadata_api(dg) -> str:
    """Which get_paged_mqa_logits_metadata this DeepGEMM has: API_V25 or API_OLD."""
    names = params(getattr(dg, "get_paged_mqa_logits_metadata", None))
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
    """deep_gemm from the kernels folder: a fetched build's folder, or a tarball unpacked once,
    put first on sys.path."""
    if Path(build.path).is_dir():
        return _from_folder(Path(build.path).parent)
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
    kernels=(".kernels/deepgemm-vllm-*/deep_gemm", PACKED_GLOB),
    load_kernels=_from_kernels,
    strict=True,  # installed but failing to import (an ABI mismatch): that reason is the answer
)


def discover(lib: str | None = None):
    """The deep_gemm module: from `lib` (a folder holding deep_gemm/, as `kernels fetch` cuts
    it), else DeepGEMM itself (or sgl-deep-gemm), vLLM's bundled copy, or the checkout's kernels
    folder (library.discover)."""
    if lib:
        return _from_folder(Path(lib))
    return library.discover(LIBRARY)


def _from_folder(folder: Path):
    if not (folder / "deep_gemm/__init__.py").is_file():
        raise Unsupported(f"{NOT_FOUND}: no deep_gemm/ in {folder} (dsv4bench kernels fetch)")
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("deep_gemm")
    except Exception as e:
        raise Unsupported(f"{NOT_FOUND} from {folder}: {type(e).__name__}: {e}"[:300]) from e


def static_api(folder: Path) -> str | None:
    """Why the deep_gemm/ in `folder` has no indexer API this adapter knows, read from its
    __init__.py without importing it (an import loads its ops into the process); None if known
    or unreadable (the worker's import then says)."""
    try:
        text = (folder / "deep_gemm/__init__.py").read_text()
    except OSError:
        return None
    if "fp8_fp4_paged_mqa_logits" in text or "fp8_paged_mqa_logits" in text:
        return None
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    version = found.group(1) if found else "?"
    return (
        f"DeepGEMM {version}: no fp8_paged_mqa_logits nor fp8_fp4_paged_mqa_logits "
        "(known APIs: 2.5.0, 2.8.1)"
    )


class DeepGEMM(Backend):
    name = "deepgemm"
    description = "DeepGEMM fp8_paged_mqa_logits / fp8_mqa_logits (the indexer), top-k by torch"
    archs = ("sm90", "sm100")
    ops = ("indexer",)
    layouts = ()  # the indexer's own key cache, no attention cache

    options = {
        "lib": None,  # a folder holding deep_gemm/ (a `kernels fetch` build)
        # False: hand the sm90 paged kernel any next_n, so that each build's own check answers
        # (the build x next_n matrix) instead of the adapter's SM90_NEXT_N
        "next_n_rule": True,
    }
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "n/a: indexer logits and top-k, no attention",
        "CUDA graphs": "yes: the schedule metadata made in prepare(), the call is the op",
        "batch invariance": "not promised: the schedule metadata is per batch",
    }

    def __init__(self, module=None, lib: str | None = None, next_n_rule: bool = True):
        self.lib = lib
        self.next_n_rule = bool(next_n_rule)
        self._found = library.LazyOps(module, lambda: discover(self.lib))

    def process_key(self) -> str:
        return f"{self.base}.lib={self.lib}" if self.lib else ""  # one deep_gemm a process

    def build_reason(self) -> str | None:
        if not self.lib:
            return None
        return static_api(Path(self.lib)) or library.pinned_release_reason(self.lib)

    def provider(self) -> Provider:
        dg = self._found.get()
        indexer_api(dg)  # an API this adapter does not know: `backends` and `plan` say so
        return Provider("deep_gemm", getattr(dg, "__version__", ""), getattr(dg, "__file__", ""))

    def supports(self, case: Case, arch: str) -> str | None:
        reason = super().supports(case, arch)
        if reason:
            return reason
        if self.lib and not self._found.loaded:  # never import a pinned build here
            return self.build_reason()
        try:
            dg = self._found.get()
        except Unsupported:
            return None  # the provider line says what is missing; its rows say it too
        try:
            api = indexer_api(dg)
        except Unsupported as e:
            return str(e)
        return next_n_reason(dg, api, case, arch) if self.next_n_rule else None

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        from reference.indexer import topk_indices

        dg = self._found.get()
        api = indexer_api(dg)
        if "kv" in inputs and api == API_V28:
            return _ragged_v28(dg, case, inputs)
        if "kv" in inputs:
            logits, info = _ragged(dg, inputs)
        else:
            arch = _device_arch(device)
            reason = next_n_reason(dg, api, case, arch) if arch and self.next_n_rule else None
            if reason:
                raise Unsupported(reason)
            logits, info = _paged(dg, case, inputs, api, arch)

        def run():
            out = logits()
            return out, topk_indices(out, case.topk)

        info["topk"] = "torch.topk"
        finish = lambda raw: Output(raw[0], None, raw[1])  # noqa: E731
        return Prepared(run=run, finish=finish, info=info, logits=logits)


def _device_arch(device: str) -> str | None:
    import torch

    if not str(device).startswith("cuda"):
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def next_n_reason(dg, api: str, case: Case, arch: str) -> str | None:
    """The sm90 paged kernel of 2.5.0 and 2.8.1 takes next_n 1, 2 or 4 only (both assert it
    in smxx_fp8_fp4_paged_mqa_logits.hpp, seen on an H100; engines flatten the others)."""
    paged = api in (API_V25, API_V28) and not case.tokens
    if not paged or arch != "sm90" or case.s_q in SM90_NEXT_N:
        return None
    version = getattr(dg, "__version__", "?")
    kernel = "fp8_fp4_paged_mqa_logits" if api == API_V28 else "fp8_paged_mqa_logits"
    return (
        f"DeepGEMM {version} sm90 {kernel} takes next_n 1, 2 or 4, not {case.s_q} "
        "(DeepGEMM issue 340; engines flatten to one row per query)"
    )


def _ragged_v28(dg, case: Case, x: dict) -> Prepared:
    """2.8.1's ragged form: compressed rows, top-k over them shifted by ks (see the docstring)."""
    import torch

    from reference.indexer import topk_indices

    ks, ke = x["ks"], x["ke"]
    width = max(int((ke - ks).max()), 1)
    cols = torch.arange(width, device=ks.device)
    past = cols[None, :] >= (ke - ks)[:, None]
    n = x["kv"].shape[0]

    def logits():
        out = dg.fp8_fp4_mqa_logits(
            (x["q"], None), (x["kv"], x["kv_scales"]), x["weights"], ks, ke, width
        )
        return out.masked_fill_(past, float("-inf"))

    def run():
        out = logits()
        top = topk_indices(out, case.topk)
        return out, torch.where(top >= 0, top + ks[:, None].to(top.dtype), top)

    def finish(raw) -> Output:
        rows, top = raw
        full = torch.full((rows.shape[0], n), float("-inf"), dtype=rows.dtype, device=rows.device)
        r, c = (~past).nonzero(as_tuple=True)
        full[r, ks.long()[r] + c] = rows[r, c]
        return Output(full, None, top)

    info = {
        "kernel": "fp8_fp4_mqa_logits",
        "logits": "compressed rows from ks",
        "topk": "torch.topk",
    }
    return Prepared(run=run, finish=finish, info=info, logits=logits)


def _ragged(dg, x: dict):
    def logits():
        kv = (x["kv"], x["kv_scales"])
        return dg.fp8_mqa_logits(x["q"], kv, x["weights"], x["ks"], x["ke"])

    return logits, {"kernel": "fp8_mqa_logits"}


def _paged(dg, case: Case, x: dict, api: str, arch: str | None):
    import torch

    from dsv4bench.cases import indexer_case
    from reference.indexer import paged_visible

    lens = x["context_lens"]
    cache = x["kv_cache"]  # uint8 (blocks, block_size, 1, D + 4), as DeepGEMM's tests
    b, next_n = x["q"].shape[:2]
    slots = dg.get_num_sms()
    if api in (API_V25, API_V28) and arch == "sm90" and next_n == 4:  # a task a 2-CTA cluster
        slots //= 2
    if api in (API_V25, API_V28):
        if lens.dim() == 1:  # per query row: what the 1-D causal rule gives each row
            lens = paged_visible(lens, next_n).view(b, next_n).to(lens.dtype).contiguous()
        sched = dg.get_paged_mqa_logits_metadata(lens, cache.shape[1], slots)
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
        if api == API_V28:
            out = dg.fp8_fp4_paged_mqa_logits(
                (x["q"], None), cache, x["weights"], lens, x["block_table"], sched, max_len
            )
        else:
            out = dg.fp8_paged_mqa_logits(
                x["q"],
                cache,
                x["weights"],
                lens,
                x["block_table"],
                sched,
                max_len,
                clean_logits=clean,
            )
        if past is not None:
            out.masked_fill_(past, float("-inf"))
        return out

    info = {
        "kernel": "fp8_fp4_paged_mqa_logits" if api == API_V28 else "fp8_paged_mqa_logits",
        "metadata_api": f"get_paged_mqa_logits_metadata({API_V25 if api == API_V28 else api})",
        "schedule_slots": slots,
        "context_lens": "2-D" if lens.dim() == 2 else "1-D",
        "clean_logits": "by the kernel" if clean else "masked after the call, timed",
        "schedule_entries": int(sched.numel()) if hasattr(sched, "numel") else None,
    }
    return logits, info
