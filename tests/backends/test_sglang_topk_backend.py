"""The `sglang-topk` backend on the CPU: its calls against fake modules that check arguments
as sglang's TensorMatchers do (fast_topk.cuh FastTopKKernel::run, topk_v2.cuh
TopKKernel::transform_paged / transform_ragged / plan) and compute the documented answer from
them, judged like a row against the oracle; k values the kernels refuse; a missing piece
(sources, tvm-ffi, nvcc) as one line; the JIT's wrapper, flags and cache.

NOT shown here: that the compiled kernels take these arguments and answer as documented
(tests/backends/test_topk_gpu.py runs them against the oracle on a CUDA GPU)."""

from __future__ import annotations

import math
import stat
import textwrap
from pathlib import Path

import pytest
import torch

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.sgl_topk import jit, sources
from dsv4bench.backends.sgl_topk.backend import POISON, SglangTopK
from dsv4bench.backends.toolchains import nvcc as toolchain_nvcc
from dsv4bench.cases import inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import judge
from dsv4bench.measure.topk import compare_forms
from dsv4bench.scenarios import load_text

I32 = torch.int32


def _window_topk(score, lengths, k, starts):
    """(rows, k) picks relative to starts, -1 padded (the fakes' own selection)."""
    rows, width = score.shape
    cols = torch.arange(width)
    inside = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
    kk = min(k, width)
    values, idx = score.masked_fill(~inside, -math.inf).topk(kk, dim=1)
    local = torch.where(torch.isfinite(values), idx - starts[:, None], -1)
    return torch.cat([local, torch.full((rows, k - kk), -1)], 1).flip(1).to(I32)  # unordered


def _vector(t, rows: int, name: str) -> None:
    assert t.dtype == I32 and t.shape == (rows,), (name, t.dtype, t.shape)


class Module(dict):
    """A tvm-ffi module stand-in: entry name -> function; records each call."""

    def __init__(self, **entries):
        super().__init__(entries)
        self.calls: list[tuple[str, tuple]] = []


def fast_topk_module(k: int) -> Module:
    m = Module()

    def fast_topk(score, row_starts, indices, lengths):
        m.calls.append(("fast_topk", (score, row_starts, indices, lengths)))
        rows = score.shape[0]
        assert score.dtype == torch.float32 and score.stride(1) == 1
        _vector(row_starts, rows, "row_starts")
        _vector(lengths, rows, "lengths")
        assert indices.dtype == I32 and indices.shape == (rows, k)
        indices.copy_(_window_topk(score, lengths.long(), k, row_starts.long()))

    m["fast_topk"] = fast_topk
    return m


def v2_module() -> Module:
    m = Module()

    def plan(seq_lens, metadata, threshold):
        m.calls.append(("topk_plan", (seq_lens, metadata, threshold)))
        assert metadata.shape == (seq_lens.shape[0] + 1, 2) and metadata.dtype == I32
        assert isinstance(threshold, int)

    def paged(scores, seq_lens, page_table, page_indices, page_size, metadata, raw):
        m.calls.append(("topk_transform_paged", (scores, seq_lens, page_table, page_size)))
        rows, k = page_indices.shape
        assert scores.stride(1) == 1 and scores.stride(0) % 4 == 0
        _vector(seq_lens, rows, "seq_lens")
        assert page_table.dtype == I32 and page_table.shape[0] == rows  # one row per score row
        assert metadata.shape == (rows + 1, 2) and raw is None
        assert isinstance(page_size, int) and page_size & (page_size - 1) == 0
        local = _window_topk(scores, seq_lens.long(), k, torch.zeros(rows, dtype=torch.long))
        local = local.long()
        page = page_table.long().gather(1, local.clamp(min=0) // page_size)
        page_indices.copy_(torch.where(local >= 0, page * page_size + local % page_size, -1))

    def ragged(scores, seq_lens, row_starts, out_offsets, out):
        m.calls.append(("topk_transform_ragged", (scores, seq_lens, row_starts, out_offsets)))
        rows, k = out.shape
        _vector(seq_lens, rows, "seq_lens")
        _vector(out_offsets, rows, "out_offsets")
        starts = torch.zeros(rows, dtype=torch.long) if row_starts is None else row_starts.long()
        local = _window_topk(scores, seq_lens.long(), k, starts).long()
        out.copy_(torch.where(local >= 0, local + out_offsets.long()[:, None], -1))

    m.update(topk_plan=plan, topk_transform_paged=paged, topk_transform_ragged=ragged)
    return m


def _case(point: str, form: str):
    text = f"name: t\nop: topk\nbackends: [torch]\ncases:\n  - {point}\n    form: {form}\n"
    return load_text(textwrap.dedent(text), "t.yaml", known_backends=("torch",)).cases[0]


POINTS = {  # decode with two rows per request (row_to_batch not the identity), prefill chunk
    "v4-nextn2": "model: v4-flash\n    batch_size: 3\n    s_q: 2\n    context_len: 8192",
    "v32-chunk": "model: v3.2\n    tokens: 16\n    context_len: 4096",
}


def _run(backend, case, x):
    prepared = backend.prepare(case, x, "cpu")
    prepared.poison()
    return prepared, prepared.finish(prepared.run())


@pytest.mark.parametrize("form", ["plain", "page_table", "ragged"])
@pytest.mark.parametrize("point", list(POINTS))
def test_each_form_answers_as_the_oracle(point, form):
    case = _case(POINTS[point], form)
    modules = {"fast_topk_512": fast_topk_module(512), "fast_topk_2048": fast_topk_module(2048)}
    modules["topk_v2"] = v2_module()
    x = inputs.make_inputs(case, "cpu")
    prepared, out = _run(SglangTopK(modules=modules), case, x)
    acc = compare_forms(case, x, oracle_call(case, x)(), out)
    assert judge.verdict(acc, case.tolerance) == ("ok", ""), acc
    assert acc["topk_matched"] == 1.0 and acc["topk_invalid"] == 0
    called = [(n, c) for m in modules.values() for n, c in m.calls]
    entry = {"plain": "fast_topk", "page_table": "topk_transform_paged"}.get(
        form, "topk_transform_ragged"
    )
    assert entry in [n for n, _ in called] and entry in prepared.info["kernel"]
    if form == "page_table":  # planned once, outside the timed call; the table row per row
        assert [n for n, _ in called].count("topk_plan") == 1
        table = dict(called)["topk_transform_paged"][2]
        assert torch.equal(table, x["block_table"][x["row_to_batch"].long()].to(I32))
    if form == "ragged":  # windows at column 0: sglang's single-request call (no row_starts)
        assert dict(called)["topk_transform_ragged"][2] is None


def test_fast_topk_picks_are_relative_to_the_row_starts():
    case = _case(POINTS["v4-nextn2"], "plain")
    x = inputs.make_inputs(case, "cpu")
    shift = 5  # every window moved right by 5 columns
    x["logits"] = torch.cat([torch.full((x["logits"].shape[0], shift), 1e9), x["logits"]], 1)
    x["row_starts"] = torch.full_like(x["lengths"], shift)
    m = fast_topk_module(512)
    prepared, out = _run(SglangTopK(modules={"fast_topk_512": m}), case, x)
    raw = m.calls[0][1][2]
    assert int(raw.max()) < int(x["lengths"].max())  # the kernel's picks: relative
    assert int(out.out.max()) >= shift  # the op's: columns
    acc = compare_forms(case, x, oracle_call(case, x)(), out)
    assert acc["topk_matched"] == 1.0 and acc["topk_invalid"] == 0


def test_a_pick_never_written_is_not_taken_for_an_index():
    case = _case(POINTS["v4-nextn2"], "plain")
    x = inputs.make_inputs(case, "cpu")
    lazy = Module(fast_topk=lambda score, starts, indices, lengths: None)
    _, out = _run(SglangTopK(modules={"fast_topk_512": lazy}), case, x)
    assert bool((out.out == POISON).all())
    acc = compare_forms(case, x, oracle_call(case, x)(), out)
    assert judge.verdict(acc, case.tolerance)[0] != "ok"


def test_k_the_kernels_refuse_is_unsupported_naming_theirs():
    backend = SglangTopK(modules={})
    pro = _case("model: v4-pro\n    batch_size: 1\n    context_len: 131072", "plain")
    assert "512 or 2048, not 1024" in backend.supports(pro, "sm90")
    with pytest.raises(Unsupported, match="512 or 2048"):
        backend.prepare(pro, {}, "cpu")
    assert backend.supports(_case(POINTS["v4-nextn2"], "page_table"), "sm90") is None
    assert "sm90" in backend.supports(_case(POINTS["v4-nextn2"], "plain"), "sm100")


def _build(tmp_path: Path, *, csrc=True, include=True, tvm=True) -> Path:
    folder = tmp_path / "sglang-topk-0.5.23"
    if csrc:
        for name in jit_sources():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text("// kernel\n")
    if include:
        probe = folder / sources.HEADER_PROBE
        probe.parent.mkdir(parents=True)
        probe.write_text("// header\n")
    if tvm:
        (folder / "site/tvm_ffi/include/tvm/ffi").mkdir(parents=True)
        (folder / "site/tvm_ffi/include/tvm/ffi/function.h").write_text("//\n")
        (folder / "site/tvm_ffi/lib").mkdir(parents=True)
        (folder / "site/tvm_ffi/lib/libtvm_ffi.so").write_bytes(b"")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def jit_sources() -> tuple[str, ...]:
    from dsv4bench.kernels.catalog import SGL_TOPK_SOURCES

    return SGL_TOPK_SOURCES


def _nvcc(tmp_path: Path, body: str) -> str:
    path = tmp_path / "bin" / "nvcc"
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize(
    ("missing", "words"),
    [("csrc", "fast_topk.cuh"), ("include", "topk_impl.cuh"), ("tvm", "tvm-ffi")],
)
def test_a_missing_piece_is_one_line(tmp_path, missing, words):
    backend = SglangTopK(lib=str(_build(tmp_path, **{missing: False})))
    reason = backend.build_reason()
    assert words in reason and "\n" not in reason and "kernels fetch sglang" in reason
    case = _case(POINTS["v4-nextn2"], "plain")
    with pytest.raises(Unsupported, match=words.replace(".", r"\.")):
        backend.prepare(case, inputs.make_inputs(case, "cpu"), "cpu")


def test_no_nvcc_is_one_line(tmp_path, monkeypatch):
    backend = SglangTopK(lib=str(_build(tmp_path)))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv(toolchain_nvcc.ENV_NVCC, raising=False)
    reason = backend.build_reason()
    assert "sglang's top-k is built on first use by nvcc: no nvcc" in reason


def test_wrappers_export_what_sglang_exports():
    fast = jit.fast_topk(2048).wrapper()
    assert '#include "elementwise/fast_topk.cuh"' in fast
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(fast_topk, (FastTopKKernel<2048, true>::run));" in fast
    v2 = jit.topk_v2().wrapper()
    for name in ("transform_paged", "transform_ragged", "plan"):
        assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_{name}, (TopKKernel<true>::{name}));" in v2
    assert "kpool" not in v2
    with pytest.raises(Unsupported, match="512 or 2048"):
        jit.fast_topk(1024)


def test_builds_for_sm90a_with_the_arch_sglang_injects_and_caches(tmp_path):
    folder = _build(tmp_path)
    log = tmp_path / "calls"
    script = (
        f'echo "$@" >> {log}\n'
        'case "$1" in --version) echo "release 13.0";; *) '
        'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done; '
        'echo module > "$out";; esac\n'
    )
    nvcc = _nvcc(tmp_path, script)
    src = sources.from_build(folder)
    module, info = jit.build(src, jit.fast_topk(512), nvcc, (9, 0))
    assert module.parent == folder / "jit" and "fast_topk_512" in module.name
    text = log.read_text()
    assert "-gencode=arch=compute_90a,code=sm_90a" in text and "-DSGL_CUDA_ARCH=900" in text
    assert f"{folder}/include" in text and "-ltvm_ffi" in text
    again, _ = jit.build(src, jit.fast_topk(512), nvcc, (9, 0))
    assert again == module and log.read_text().count("-o ") == text.count("-o ")
    other, _ = jit.build(src, jit.topk_v2(), nvcc, (9, 0))
    assert other != module  # a module per entry
    with pytest.raises(Unsupported, match="sm_100"):
        jit.build(src, jit.topk_v2(), nvcc, (10, 0))


def test_failing_nvcc_is_remembered_with_its_last_lines(tmp_path, monkeypatch):
    script = (
        'case "$1" in --version) echo "release 13.0";; '
        '*) echo "topk_v2.cuh(12): error: boom" >&2; exit 2;; esac\n'
    )
    monkeypatch.setenv(toolchain_nvcc.ENV_NVCC, _nvcc(tmp_path, script))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    backend = SglangTopK(lib=str(_build(tmp_path)))
    case = _case(POINTS["v4-nextn2"], "ragged")
    x = inputs.make_inputs(case, "cpu")
    with pytest.raises(RuntimeError, match="rc 2.*error: boom"):
        backend.prepare(case, x, "cpu")
    monkeypatch.setenv(toolchain_nvcc.ENV_NVCC, "/nonexistent")  # not asked again: the same error
    with pytest.raises(RuntimeError, match="boom"):
        backend.prepare(case, x, "cpu")
