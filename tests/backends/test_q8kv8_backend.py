"""The q8kv8 adapter with a fake kernel module (argument order, head and top-k padding, the
identity scales, which entry each model calls, both judgements), the toolchain's one-line
reasons (no sources, no CUTLASS, no nvcc, a failing nvcc), and the JIT's cache."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.q8kv8 import jit, sources
from dsv4bench.backends.q8kv8.backend import DECLARED, Q8KV8, entry
from dsv4bench.backends.toolchains import nvcc as toolchain_nvcc
from dsv4bench.cases import inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import judge, metrics
from dsv4bench.report.load import load_rows
from tests.backends.q8kv8_fake import FakeModule
from tests.factories import V4, V32, make_case

V32_PREFILL = dict(V32, op="prefill", num_heads=64, tokens=8, topk=256, context_len=512)
V4_PREFILL = dict(V4, op="prefill", num_heads=64, tokens=8, topk=128, window=128,
                  extra_topk=128, compress_ratio=4, context_len=1024, sink=True)  # fmt: skip


def _run(case, module=None, **options):
    module = module or FakeModule()
    backend = Q8KV8(module=module, **options)
    x = inputs.make_inputs(case, "cpu")
    prepared = backend.prepare(case, x, "cpu")
    return backend, module, x, prepared


def test_v32_calls_dispatch_over_kv_with_zero_rows_and_identity_scales():
    case = make_case(V32_PREFILL, num_heads=16)
    _, module, x, prepared = _run(case)
    actual = prepared.finish(prepared.run())
    name, args = module.calls[-1]
    assert name == "dispatch" == entry(case)
    q8, kv8, idx, q_scale, kv_scale = args[:5]
    assert q8.dtype == kv8.dtype == torch.float8_e4m3fn
    assert q8.shape == (8, 64, 576) and (q8[:, 16:].float() == 0).all()  # zero-padded heads
    s_kv = x["kv"].shape[0]
    topk = idx.shape[-1]
    assert kv8.shape == (s_kv + topk, 1, 576) and (kv8[s_kv:].float() == 0).all()
    assert float(q_scale) == float(kv_scale) == 1.0
    assert args[8:15] == (8, s_kv + topk, 64, 1, 576, 512, topk)
    assert args[15] == pytest.approx(576**-0.5)
    assert actual.out.shape == (8, 16, 512) and actual.lse.shape == (8, 16)
    assert prepared.info["padded_heads"] == 64 and prepared.info["kv_zero_rows"] == topk


def test_v4_calls_dispatch_full_with_sink_padded_by_zeros_and_lengths():
    case = make_case(V4_PREFILL, num_heads=32)
    _, module, x, prepared = _run(case)
    prepared.run()
    name, args = module.calls[-1]
    assert name == "dispatch_full"
    sink, length = args[5], args[6]
    assert sink.shape == (64,) and torch.equal(sink[:32], x["attn_sink"]) and (sink[32:] == 0).all()
    assert torch.equal(length, x["topk_length"].int())
    assert args[11] == x["kv"].shape[0]  # no zero rows: topk_length masks the tail


def test_v4_without_sink_takes_the_topk_length_entry():
    case = make_case(V4_PREFILL, sink=False)
    _, module, _, prepared = _run(case)
    prepared.run()
    assert module.calls[-1][0] == "dispatch_topk_length"


def test_kernel_answer_is_judged_against_both_oracles():
    case = make_case(V32_PREFILL)
    _, _, x, prepared = _run(case)
    actual = prepared.finish(prepared.run())
    own = metrics.accuracy(prepared.exact(), actual)
    assert own["cos_diff"] < 1e-5  # the fake is the model: bf16 output rounding only
    bf16 = metrics.accuracy(oracle_call(case, x)(), actual)
    assert 1e-4 < bf16["cos_diff"] < DECLARED.cos_diff
    assert bf16["lse_max_abs"] < DECLARED.lse_abs


def test_a_wrong_kernel_is_far_from_both():
    case = make_case(V4_PREFILL)
    _, _, x, prepared = _run(case, module=FakeModule(answer=False))
    prepared.poison()
    actual = prepared.finish(prepared.run())  # never written: NaN
    assert metrics.accuracy(prepared.exact(), actual)["nonfinite"] > 0


def test_q_cast_is_timed_only_when_asked():
    case = make_case(V4_PREFILL)
    _, _, _, prepared = _run(case, time_q_cast=True)
    assert prepared.info["timed"] == "q cast + kernel"
    _, _, _, prepared = _run(case)
    assert prepared.info["timed"] == "kernel" and prepared.info["compute_precision"] == "fp8"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(route="decode-kernel"), "route decode-kernel"),
        (dict(num_heads=192, model="v4-pro"), "at most 128"),
        (dict(d_qk=576, layout="v4"), "d_qk 512, not 576"),
        (dict(head_padding="none", num_heads=32), "head_padding none gives 32"),
    ],
)
def test_plan_reasons(fields, words):
    case = make_case(V4_PREFILL, **fields)
    reason = Q8KV8(module=FakeModule()).supports(case, "sm90")
    assert reason and words in reason


def test_only_hopper():
    reason = Q8KV8(module=FakeModule()).supports(make_case(V4_PREFILL), "sm100")
    assert "sm90" in reason


def test_declared_tolerance_is_the_rows():
    case = make_case(V4_PREFILL)
    tolerance, why = Q8KV8().declared_tolerance(case)
    assert tolerance == DECLARED and "bf16 oracle" in why


Q8KV8_RUNS = Path(__file__).resolve().parents[2] / "results/sm90/studies/q8kv8"


def test_declared_tolerance_separates_the_h100_rows():
    """Re-judged with DECLARED, every H100 q8kv8 row on normal values is ok and every row on
    activation-like `outliers` values (cos_diff 0.015+) is incorrect; the bf16 bounds stay
    within 10x the largest error an ok row measured (a bound loosened 10x lets outliers pass)."""
    rows = [
        r
        for run in ("prefill", "serving")
        for r in load_rows(Q8KV8_RUNS / run)
        if r.get("backend") == "q8kv8" and r.get("kind") == "case" and r.get("accuracy")
    ]
    normal = [r for r in rows if r["params"].get("values") != "outliers"]
    outliers = [r for r in rows if r["params"].get("values") == "outliers"]
    assert len(normal) >= 30 and len(outliers) >= 8
    assert all(judge.verdict(r["accuracy"], DECLARED)[0] == "ok" for r in normal)
    assert all(judge.verdict(r["accuracy"], DECLARED)[0] == "incorrect" for r in outliers)
    largest = {k: max(r["accuracy"][k] for r in normal) for k in ("cos_diff", "lse_max_abs")}
    assert DECLARED.cos_diff < 10 * largest["cos_diff"]
    assert DECLARED.lse_abs < 10 * largest["lse_max_abs"]
    assert DECLARED.max_logits_abs < 10 * DECLARED.lse_abs


# ---- the toolchain: one line for each missing piece -------------------------------------


def _build(tmp_path: Path, *, cutlass=True, csrc=True, tvm=True) -> Path:
    folder = tmp_path / "q8kv8-sglang-0.5.23"
    if csrc:
        for name in sources.KERNEL_FILES:
            (folder / "csrc").mkdir(parents=True, exist_ok=True)
            (folder / "csrc" / name).write_text(f"// {name}\n")
    if cutlass:
        (folder / "cutlass/include/cute").mkdir(parents=True)
        (folder / "cutlass/include/cute/tensor.hpp").write_text("//\n")
    if tvm:
        (folder / "site/tvm_ffi/include/tvm/ffi").mkdir(parents=True)
        (folder / "site/tvm_ffi/include/tvm/ffi/function.h").write_text("//\n")
        (folder / "site/tvm_ffi/lib").mkdir(parents=True)
        (folder / "site/tvm_ffi/lib/libtvm_ffi.so").write_bytes(b"")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _nvcc(tmp_path: Path, body: str) -> str:
    path = tmp_path / "bin" / "nvcc"
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize(
    ("missing", "words"),
    [("cutlass", "CUTLASS headers"), ("csrc", "sglang kernel sources"), ("tvm", "tvm-ffi")],
)
def test_a_missing_piece_is_one_line(tmp_path, missing, words):
    folder = _build(tmp_path, **{missing: False})
    reason = Q8KV8(lib=str(folder)).build_reason()
    assert words in reason and "kernels fetch" in reason and "\n" not in reason


def test_no_nvcc_is_one_line(tmp_path, monkeypatch):
    folder = _build(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv(toolchain_nvcc.ENV_NVCC, raising=False)
    backend = Q8KV8(lib=str(folder))
    assert "no nvcc" in backend.build_reason()
    with pytest.raises(Unsupported, match="no nvcc"):
        backend.provider()


def test_a_whole_build_and_nvcc_give_a_provider(tmp_path, monkeypatch):
    folder = _build(tmp_path)
    monkeypatch.setenv(
        toolchain_nvcc.ENV_NVCC, _nvcc(tmp_path, "echo 'Cuda compilation tools, release 13.0'\n")
    )
    assert Q8KV8(lib=str(folder)).build_reason() is None
    prov = Q8KV8(lib=str(folder)).provider()
    assert prov.version == "sglang 0.5.23" and "q8kv8-sglang-0.5.23" in prov.location


def test_failing_nvcc_raises_its_last_lines_once(tmp_path, monkeypatch):
    folder = _build(tmp_path)
    script = (
        'case "$1" in --version) echo "release 13.0";; '
        '*) echo "kernel.cuh(12): error: boom" >&2; exit 2;; esac\n'
    )
    monkeypatch.setenv(toolchain_nvcc.ENV_NVCC, _nvcc(tmp_path, script))
    chain = jit.toolchain(str(folder))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with pytest.raises(toolchain_nvcc.CompileError, match="rc 2.*error: boom"):
        chain.module("cuda")
    monkeypatch.setenv(toolchain_nvcc.ENV_NVCC, "/nonexistent")  # not asked again: the same error
    with pytest.raises(toolchain_nvcc.CompileError, match="boom"):
        chain.module("cuda")


def test_build_is_cached_by_key_and_renamed_into_place(tmp_path, monkeypatch):
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
    module, info = jit.build(src, nvcc, (9, 0))
    assert module.parent == folder / "jit" and module.read_text() == "module\n"
    assert "sm_90a" in log.read_text() and "--use_fast_math" in log.read_text()
    builds = log.read_text().count("-o ")
    again, _ = jit.build(src, nvcc, (9, 0))
    assert again == module and log.read_text().count("-o ") == builds  # cached: no nvcc run
    (folder / "csrc" / "kernel.cuh").write_text("// changed\n")
    changed, _ = jit.build(src, nvcc, (9, 0))
    assert changed != module  # another key
    assert not [p for p in (folder / "jit").iterdir() if p.is_dir()]  # no partial left


def test_the_kernel_is_hopper_code():
    with pytest.raises(Unsupported, match="sm_100"):
        jit.gencode((10, 0))
    assert jit.gencode((9, 0)) == ["-gencode", "arch=compute_90a,code=sm_90a"]


def test_wrapper_exports_the_three_entries():
    for name, fn in jit.ENTRIES.items():
        assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, ({fn}));" in jit.WRAPPER


def test_v32_takes_any_multiple_of_64_heads():
    backend = Q8KV8(module=FakeModule())
    assert backend.supports(make_case(V32_PREFILL, num_heads=192), "sm90") is None
    reason = backend.supports(make_case(V32_PREFILL, num_heads=96, head_padding="none"), "sm90")
    assert "multiples of 64, not 96" in reason


# ---- the row's verdict: both judgements, through the worker ----------------------------------


class OnCpu(Q8KV8):
    """The adapter as the worker runs it, on a CPU (the fake module answers there)."""

    archs = ("cpu", "sm90")


def _row(case, module):
    from dsv4bench.run.worker import Cache, check_row

    return check_row(case, OnCpu(module=module), "cpu", Cache())[0]


def test_the_row_is_judged_by_the_kernels_own_model_too():
    case = make_case(V32_PREFILL)
    row = _row(case, FakeModule())
    assert row.status == "ok", row.message
    assert row.tolerance["exact_cos_diff"] == DECLARED.exact_cos_diff
    assert row.tolerance["exact_lse_abs"] == DECLARED.exact_lse_abs
    assert "results/sm90/studies/q8kv8" in row.info["tolerance_from"]
    # off its own model by ~1e-4 (past the 5e-5 bound), still within the FP8 tolerance
    row = _row(case, FakeModule(noise=0.014))
    assert row.accuracy["cos_diff"] < DECLARED.cos_diff
    assert row.accuracy["exact_cos_diff"] > DECLARED.exact_cos_diff
    assert row.status == "incorrect" and row.message.startswith("exact_cos_diff ")
    assert "kernel's own model" in row.message


def test_max_logits_is_returned_and_judged_against_both():
    case = make_case(V4_PREFILL)
    row = _row(case, FakeModule())
    acc = row.accuracy
    # one FP8-rounded logit: past the lse's bound, within the declared max_logits_abs
    assert DECLARED.lse_abs < acc["max_logits_max_abs"] < DECLARED.max_logits_abs
    assert acc["max_logits_mismatch"] == 0 and row.status == "ok"
    assert acc["exact_max_logits_max_abs"] == 0.0  # the fake writes the model's own
    _, _, _, prepared = _run(case, module=FakeModule(answer=False))
    prepared.poison()
    actual = prepared.finish(prepared.run())  # never written: NaN in all three
    assert actual.max_logits.isnan().all() and actual.lse.isnan().all()


def test_activation_like_values_saturate_the_identity_scale_casts():
    """values: outliers puts some q and kv values past 448: sglang's scale-1 casts clamp them,
    the error against the bf16 oracle grows far past the normal case's, and the kernel's own
    model (the same clamped operands) still holds."""
    case = make_case(V32_PREFILL, values="outliers", tokens=16)
    _, module, x, prepared = _run(case)
    prepared.run()
    q8, kv8 = module.calls[-1][1][:2]
    assert (x["q"].float().abs() > 448).any() and q8.float().abs().max() == 448
    assert (x["kv"].float().abs() > 448).any() and kv8.float().nan_to_num().abs().max() == 448
    normal = _row(make_case(V32_PREFILL, tokens=16), FakeModule())
    row = _row(case, FakeModule())
    assert row.accuracy["cos_diff"] > 10 * normal.accuracy["cos_diff"]
    assert row.accuracy["exact_cos_diff"] <= DECLARED.exact_cos_diff
    assert row.status == "incorrect" and not row.message.startswith("exact")


def test_a_q8kv8_row_judges_its_max_logits():
    row = _row(make_case(V32_PREFILL), FakeModule())
    assert "max_logits" not in row.info and "max_logits_max_abs" in row.accuracy
