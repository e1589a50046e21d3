"""The `topk` backends on the CPU: FlashInfer's adapter against fakes with the real signatures
of flashinfer/topk.py (0.7.2.post1) that compute the answer from the arguments they are given,
and the project's Triton kernel through Triton's interpreter at tiny shapes, each judged like a
row (measure/topk.compare_forms: by selected scores, ties allowed) against the oracle.

NOT shown here: that FlashInfer's kernels take these arguments on a GPU, and the compiled
Triton kernel (tests/backends/test_topk_gpu.py does both on a CUDA GPU)."""

from __future__ import annotations

import dataclasses
import math
import textwrap

import pytest
import torch

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.flashinfer import topk as fi_topk
from dsv4bench.backends.flashinfer.backend import FlashInfer, KernelOps
from dsv4bench.cases import inputs
from dsv4bench.cases.case import Case
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import judge
from dsv4bench.measure.topk import compare_forms
from dsv4bench.scenarios import load_text
from reference.topk import FORMS

CALLS: list[tuple[str, dict]] = []


def _window_topk(input, lengths, k, row_starts=None):
    """(rows, k) picks relative to the row start, -1 padded: the fakes' own selection."""
    rows, width = input.shape
    starts = torch.zeros_like(lengths) if row_starts is None else row_starts
    cols = torch.arange(width)
    inside = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
    masked = input.masked_fill(~inside, -math.inf)
    kk = min(k, width)
    values, idx = masked.topk(kk, dim=1)
    local = torch.where(torch.isfinite(values), idx - starts[:, None], -1)
    return torch.cat([local, torch.full((rows, k - kk), -1)], 1).to(torch.int32)


def top_k(input, k, sorted=False, deterministic=False, tie_break=0, dsa_graph_safe=False):
    CALLS.append(("top_k", {"k": k, "sorted": sorted}))
    values, idx = input.topk(k, dim=1)
    flip = torch.arange(k - 1, -1, -1)  # unsorted, as FlashInfer's default may be
    return values[:, flip], idx[:, flip]


def top_k_page_table_transform(
    input, src_page_table, lengths, k, row_to_batch=None, deterministic=False, tie_break=0,
    dsa_graph_safe=False, row_starts=None, page_table_row_starts=None, *, page_size=1, out=None,
    out_raw_indices=None,
):  # fmt: skip
    CALLS.append(("page_table", {"page_size": page_size, "out": out, "rtb": row_to_batch}))
    if page_size != 1 and row_starts is not None and page_table_row_starts is None:
        raise ValueError("page_table_row_starts is required with page_size > 1 and row_starts")
    local = _window_topk(input, lengths, k, row_starts).long()
    batch = torch.arange(input.shape[0]) if row_to_batch is None else row_to_batch.long()
    pt_start = 0 if page_table_row_starts is None else page_table_row_starts.long()[:, None]
    page = src_page_table.long()[batch[:, None], pt_start + local.clamp(min=0) // page_size]
    slots = torch.where(local >= 0, page * page_size + local % page_size, -1).to(torch.int32)
    if out is None:
        return slots
    out.copy_(slots)
    return out


def top_k_ragged_transform(
    input, offsets, lengths, k, deterministic=False, tie_break=0, dsa_graph_safe=False,
    row_starts=None,
):  # fmt: skip
    CALLS.append(("ragged", {"row_starts": row_starts}))
    local = _window_topk(input, lengths, k, row_starts)
    return torch.where(local >= 0, local + offsets[:, None], -1).to(torch.int32)


def _fi(**missing) -> FlashInfer:
    fns = {
        "topk_plain": top_k,
        "topk_page_table": top_k_page_table_transform,
        "topk_ragged": top_k_ragged_transform,
    }
    fns.update(missing)
    return FlashInfer(ops=KernelOps(Provider("flashinfer", "0.7.2.post1"), **fns), arch="sm90")


def _cases(form: str) -> list[Case]:
    text = f"""\
        name: t
        op: topk
        backends: [torch]
        cases:
          - model: [v3.2, v4-flash]
            batch_size: 2
            s_q: 2
            context_len: 256
            topk: 32
            page_size: 16
            form: {form}
          - model: v3.2
            tokens: 8
            context_len: 40
            topk: 36
            page_size: 16
            form: {form}
    """
    return load_text(textwrap.dedent(text), "t.yaml", known_backends=("torch",)).cases


def _judge(case: Case, x: dict, prepared) -> dict:
    if prepared.poison is not None:
        prepared.poison()
    actual = prepared.finish(prepared.run())
    acc = compare_forms(case, x, oracle_call(case, x)(), actual)
    assert judge.verdict(acc, case.tolerance) == ("ok", ""), acc
    return acc


@pytest.mark.parametrize("form", FORMS)
def test_flashinfer_adapter_matches_the_oracle(form: str) -> None:
    backend = _fi()
    for case in _cases(form):
        assert backend.supports(case, "sm90") is None
        x = inputs.make_inputs(case, "cpu")
        CALLS.clear()
        acc = _judge(case, x, backend.prepare(case, x, "cpu"))
        assert acc["topk_matched"] == 1.0 and acc["topk_invalid"] == 0
        (name, kw), *_ = CALLS
        if form == "page_table":  # the case's pages, its requests, a preallocated out
            assert kw["page_size"] == 16 and kw["out"] is not None
            assert torch.equal(kw["rtb"], x["row_to_batch"])
        if form == "plain":
            assert kw == {"k": case.topk, "sorted": False}


def test_plain_masks_minus_inf_picks_and_the_chunk_pads() -> None:
    """A chunk at context 40 with top-k 36: early rows see fewer than 36 keys, so top_k picks
    -inf entries there; the adapter turns them into -1."""
    backend = _fi()
    case = _cases("plain")[-1]
    x = inputs.make_inputs(case, "cpu")
    out = backend.prepare(case, x, "cpu").run()
    assert ((out >= 0).sum(1) == x["lengths"].clamp(max=36)).all()
    assert (x["lengths"] < 36).any()


def test_row_starts_reach_the_transforms() -> None:
    case = _cases("page_table")[0]
    x = inputs.make_inputs(case, "cpu")
    x["row_starts"] = torch.full_like(x["lengths"], 3)
    x["lengths"] = x["lengths"] - 3
    prepared = _fi().prepare(case, x, "cpu")  # page_table_row_starts given: else it raises
    _judge(case, x, prepared)
    case = _cases("ragged")[0]
    y = inputs.make_inputs(case, "cpu")
    y["row_starts"], y["lengths"] = x["row_starts"], x["lengths"]
    CALLS.clear()
    _judge(case, y, _fi().prepare(case, y, "cpu"))
    assert torch.equal(CALLS[0][1]["row_starts"], y["row_starts"])
    with pytest.raises(Unsupported, match="row starts"):
        _fi().prepare(_cases("plain")[0], x, "cpu")


def test_a_build_without_the_function_or_a_parameter_is_unsupported() -> None:
    case = _cases("ragged")[0]
    x = inputs.make_inputs(case, "cpu")
    with pytest.raises(Unsupported, match="has no flashinfer.topk.top_k_ragged_transform"):
        _fi(topk_ragged=None).prepare(case, x, "cpu")

    def old(input, src_page_table, lengths, k, row_to_batch=None, row_starts=None):
        raise AssertionError("not called")

    case = _cases("page_table")[0]
    x = inputs.make_inputs(case, "cpu")
    with pytest.raises(Unsupported, match="no parameter page_table_row_starts, page_size, out"):
        _fi(topk_page_table=old).prepare(case, x, "cpu")


def test_flashinfer_topk_supports() -> None:
    case = _cases("plain")[0]
    assert _fi().supports(case, "sm100") is None
    assert "not cpu" in FlashInfer().supports(case, "cpu")
    wide = Case(**{**case.params(), "scenario": "t", "topk": 1024})  # 256 keys only
    assert "k <= the row width" in fi_topk.supports(wide)
    assert fi_topk.supports(dataclasses.replace(wide, form="page_table")) is None  # pads
    assert "unknown top-k form" in fi_topk.supports(
        Case(**{**case.params(), "form": "x"}, scenario="t")
    )


# ---- the project's Triton kernel, interpreted ---------------------------------------------


def _triton():
    pytest.importorskip("triton", reason="needs triton (pip install triton)")
    from dsv4bench.backends.triton import topk as tt

    return tt


@pytest.mark.parametrize("form", FORMS)
def test_triton_kernel_matches_the_oracle(form: str) -> None:
    tt = _triton()
    cases = _cases(form)  # every shape once (plain), the V3.2 decode rows for the transforms
    for case in cases if form == "plain" else cases[:1]:
        x = inputs.make_inputs(case, "cpu")
        prepared = tt.prepare(case, x, "cpu")
        acc = _judge(case, x, prepared)
        assert acc["topk_matched"] == 1.0 and acc["topk_count_mismatch"] == 0
        assert not (prepared.run() == tt.POISON).any()  # every place written


def test_triton_kernel_on_ties_minus_inf_and_short_windows() -> None:
    """Integer logits (ties at every k-th place), -inf inside windows, empty and short windows,
    rows starting past column 0, blocks smaller than a row."""
    tt = _triton()
    from reference import topk as ref

    g = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 4, (5, 300), generator=g).float()
    logits[0, 10:60] = -math.inf
    logits[4] = -0.0  # every logit a tie, -0 and +0 alike
    logits[4, ::2] = 0.0
    x = {
        "logits": logits,
        "lengths": torch.tensor([300, 10, 0, 41, 200], dtype=torch.int32),
        "row_starts": torch.tensor([0, 5, 0, 100, 50], dtype=torch.int32),
    }
    for k in (1, 40, 512):
        launch, _ = tt.launcher(logits, x["lengths"], k, row_starts=x["row_starts"], block=64)
        got = launch()
        want = ref.select(x, k, "plain")
        for r in range(5):
            picks = got[r][got[r] >= 0].long()
            assert len(set(picks.tolist())) == len(picks) == int((want[r] >= 0).sum())
            assert (got[r][len(picks) :] == -1).all()
            s, e = int(x["row_starts"][r]), int(x["row_starts"][r] + x["lengths"][r])
            assert ((picks >= s) & (picks < e)).all()
            mine = sorted(logits[r, picks].tolist(), reverse=True)
            theirs = sorted(logits[r, want[r][want[r] >= 0].long()].tolist(), reverse=True)
            assert mine == theirs


def test_triton_launcher_refuses_what_it_cannot_read() -> None:
    tt = _triton()
    lens = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="float32"):
        tt.launcher(torch.zeros(2, 8, dtype=torch.float16), lens, 2)
    with pytest.raises(ValueError, match="form"):
        tt.launcher(torch.zeros(2, 8), lens, 2, "sorted")


@pytest.mark.parametrize("form", [0, 1, 2])
def test_triton_kernel_compiles_for_sm90(form: int) -> None:
    """The interpreter runs what the compiler refuses (a loop-carried name changing type):
    compile each form for sm90 here, as the GPU would (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from dsv4bench.backends.triton import topk as triton_topk
    from dsv4bench.backends.triton.kernels import topk as kernels

    pointers = ("logits_ptr", "lengths_ptr", "starts_ptr", "out_ptr", "table_ptr", "batch_ptr")
    signature = {name: "*i32" for name in pointers} | {"logits_ptr": "*fp32"}
    signature |= {"row_stride": "i32", "table_s0": "i32", "offsets_ptr": "*i32", "K": "i32"}
    signature |= {"FORM": "constexpr", "PAGE": "constexpr", "BLOCK": "constexpr"}
    fn = JITFunction(kernels.topk_kernel)
    order = list(fn.arg_names)
    source = ASTSource(
        fn,
        {name: signature[name] for name in order},
        constexprs={"FORM": form, "PAGE": 64, "BLOCK": triton_topk.BLOCK},
    )
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": triton_topk.WARPS}
    )
    assert "st.global" in compiled.asm["ptx"]


def test_torch_topk_is_the_engines_call_and_matches_the_oracle() -> None:
    """`torch-topk` (the call vLLM's indexer makes) on every plain shape, the short windows of
    a chunk included (picks past a row's window become -1); its other forms are refused."""
    from dsv4bench.backends.torch_topk import TorchTopK

    backend = TorchTopK()
    for case in _cases("plain"):
        assert backend.supports(case, "sm90") is None and backend.supports(case, "cpu") is None
        x = inputs.make_inputs(case, "cpu")
        prepared = backend.prepare(case, x, "cpu")
        acc = _judge(case, x, prepared)
        assert acc["topk_matched"] == 1.0 and acc["topk_invalid"] == 0
        out = prepared.run()
        assert out.dtype == torch.int32 and out.shape == (x["logits"].shape[0], case.topk)
        assert ((out >= 0).sum(1) == x["lengths"].clamp(max=case.topk)).all()
        assert prepared.info["kernel"] == "torch.topk"
    for form in ("page_table", "ragged"):
        reason = backend.supports(_cases(form)[0], "sm90")
        assert reason and f"the {form} form is an engine's own transform" in reason


def test_torch_topk_masks_every_pick_outside_a_rows_window() -> None:
    """Picks before a row's start or past its end are -1 (vLLM's mask_lo / mask_hi), whatever
    the logits there; inside, the window's largest, descending."""
    from dsv4bench.backends.torch_topk import TorchTopK

    case = dataclasses.replace(_cases("plain")[0], topk=4)
    logits = torch.arange(10, dtype=torch.float32).repeat(2, 1)
    logits[1, :2] = 100.0  # before row 1's window
    x = {"logits": logits, "lengths": torch.tensor([3, 8]), "row_starts": torch.tensor([7, 2])}
    out = TorchTopK().prepare(case, x, "cpu").run()
    assert out.tolist() == [[9, 8, 7, -1], [-1, -1, 9, 8]]
