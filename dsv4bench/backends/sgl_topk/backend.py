"""sglang 0.5.23's JIT top-k kernels for the `topk` op (cases/topk_case.py), one entry per form,
called as sglang's indexers call them:

  plain       fast_topk (sglang/kernels/ops/attention/fast_topk.py; the QSA indexer's):
              module.fast_topk(score (rows, width) fp32, row_starts (rows,) int32, indices
              (rows, k) int32, lengths (rows,) int32); k is compiled in, 512 or 2048. Picks
              are relative to row_starts, -1 past the row's length, unordered; finish() adds
              row_starts back (untimed: sglang's callers read them relative).
  page_table  topk_transform_paged_v2 (dsv4/topk.py; DSA decode's _topk_transform_v2_paged
              and the V4 C4 indexer with use_topk_v2): module.topk_transform_paged(scores,
              seq_lens, page_table (rows, pages) int32, page_indices (rows, k) int32,
              page_size, metadata (rows + 1, 2) int32, raw_indices None) writes
              page_table[i, p // page_size] * page_size + p % page_size, -1 padded. The page
              table has one row per score row (the request's block table row, gathered by
              row_to_batch) and the plan (module.topk_plan(seq_lens, metadata, -1), sglang's
              plan_topk_v2) is made once per forward in sglang: both are made here outside
              the timed call.
  ragged      topk_transform_ragged_v2 (DSA prefill's _topk_transform_v2_ragged):
              module.topk_transform_ragged(scores, seq_lens, row_starts or None, out_offsets,
              out_indices) writes p + out_offsets[i], -1 padded; no plan.

v2 takes 0 < k <= 2048, a score row stride that is a multiple of 4 and a power-of-two page
size. The v2 kernels write the <= 3 columns ahead of an unaligned window (masked); the case's
windows start at column 0.
"""

from __future__ import annotations

from dsv4bench.backends.base import Backend, Prepared, Provider, Unsupported
from dsv4bench.backends.sgl_topk import jit
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

V2_MAX_K = 2048  # topk_v2.cuh: "topk must be in (0, 2048]"
STRIDE_MULTIPLE = 4  # topk_v2.cuh: 16-byte vectorized loads of the score rows
POISON = -3  # neither -1 nor an index: an output the kernel never wrote shows
FORMS = {
    "plain": ("fast_topk", "fast_topk"),
    "page_table": ("topk_v2", "topk_transform_paged"),
    "ragged": ("topk_v2", "topk_transform_ragged"),
}


def module_spec(case: Case) -> jit.ModuleSpec:
    return jit.fast_topk(case.topk) if case.form == "plain" else jit.topk_v2()


class SglangTopK(Backend):
    name = "sglang-topk"
    description = "sglang's JIT top-k (fast_topk, DeepSeek-V4 top-k v2), built by nvcc"
    archs = ("sm90",)
    ops = ("topk",)
    options = {"lib": None}
    # what no probe case finds (report/capabilities.py; the others follow supports())
    capabilities = {
        "lse out": "n/a: top-k indices, no attention",
        "CUDA graphs": "yes: the v2 plan and page table made in prepare(), the call is the op",
        "batch invariance": "not promised: picks come in atomic collection order",
    }

    def __init__(self, lib: str | None = None, modules: dict | None = None):
        self.lib = lib
        self._injected = modules  # tests: module name ("fast_topk_512", "topk_v2") -> module
        self._toolchain = jit.toolchain(lib)

    def process_key(self) -> str:
        # its own tvm_ffi: never in a process that imported another (FlashInfer's)
        return f"sglang-topk.lib={self.lib}"

    def provider(self) -> Provider:
        if self._injected is not None:
            return Provider("sglang top-k (injected)")
        return self._toolchain.provider()

    def build_reason(self) -> str | None:
        """A missing piece (sources, tvm-ffi, nvcc), found without building."""
        return None if self._injected is not None else self._toolchain.reason()

    def supports(self, case: Case, arch: str) -> str | None:
        reason = super().supports(case, arch)
        if reason:
            return reason
        if case.form not in FORMS:
            return f"unknown top-k form {case.form!r} (known: {', '.join(FORMS)})"
        if case.form == "plain":
            try:
                jit.fast_topk(case.topk)
            except Unsupported as e:
                return str(e)
            return None
        if not 0 < case.topk <= V2_MAX_K:
            return f"sglang's top-k v2 takes 0 < k <= {V2_MAX_K}, not {case.topk}"
        page = case.page_size
        if case.form == "page_table" and (page <= 0 or page & (page - 1)):
            return f"sglang's top-k v2 takes a power-of-two page size, not {page}"
        return None

    def prepare_reason(self, case: Case, device: str) -> str | None:
        return self.supports(case, "sm90")

    def prepare_case(self, case: Case, inputs: dict, device: str) -> Prepared:
        import torch

        x = inputs
        logits, k = x["logits"], case.topk
        if logits.dtype != torch.float32 or logits.stride(1) != 1:
            raise Unsupported("sglang's top-k reads fp32 scores with unit column stride")
        rows, width = logits.shape
        i32 = lambda t: t.to(torch.int32).contiguous()  # noqa: E731
        lengths = i32(x["lengths"])
        starts = x.get("row_starts")
        starts = torch.zeros_like(lengths) if starts is None else i32(starts)
        dev = logits.device
        out = torch.empty(rows, k, dtype=torch.int32, device=dev)
        spec = module_spec(case)
        fn = self._module(spec, dev)[FORMS[case.form][1]]
        info = {"kernel": f"sglang {spec.name}.{FORMS[case.form][1]}", "form": case.form}
        finish = Output
        if case.form == "plain":

            def run():
                fn(logits, starts, out, lengths)
                return out

            finish = lambda raw: Output(_add_starts(raw, starts))  # noqa: E731
            info["picks"] = "relative to row_starts (added back untimed)"
        else:
            if logits.stride(0) % STRIDE_MULTIPLE:
                raise Unsupported(
                    f"sglang's top-k v2 takes a score row stride that is a multiple of "
                    f"{STRIDE_MULTIPLE}, not {logits.stride(0)}"
                )
            if case.form == "page_table":
                if bool(starts.any()):
                    raise Unsupported("sglang's paged top-k v2 takes no row starts")
                table = i32(x["block_table"][x["row_to_batch"].long()])
                plan = torch.zeros(rows + 1, 2, dtype=torch.int32, device=dev)
                self._module(spec, dev)["topk_plan"](lengths, plan, -1)
                page = case.page_size

                def run():
                    fn(logits, lengths, table, out, page, plan, None)
                    return out

                info["untimed"] = "page table rows by row_to_batch, plan_topk_v2 (per forward)"
            else:
                offsets = i32(x["offsets"])
                row_starts = starts if bool(starts.any()) else None

                def run():
                    fn(logits, lengths, row_starts, offsets, out)
                    return out

        info.update(self._toolchain.info(spec))
        return Prepared(run=run, finish=finish, poison=lambda: out.fill_(POISON), info=info)

    def _module(self, spec: jit.ModuleSpec, device):
        if self._injected is not None:
            if spec.name not in self._injected:
                raise Unsupported(f"no injected module {spec.name}")
            return self._injected[spec.name]
        return self._toolchain.module(device, spec)


def _add_starts(local, starts):
    """fast_topk's row-relative picks as columns of the score rows (-1 and anything the
    kernel did not write below 0 stay as they are)."""
    import torch

    return torch.where(local >= 0, local + starts[:, None], local)
