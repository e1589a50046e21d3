"""vLLM's DeepSeek V4/V4.1 Triton cache writers and gathers (backends/engine_helpers/
vllm_v4_cache.py): the real files of a `vllm-triton` build run through Triton's interpreter
against the oracle (vllm_v4_cache_run.py, in a process of its own); with fakes, the arguments
they get as vLLM passes them, the guard bytes, the layouts they decline and why; the stubs the
files load with; the interpreter's e4m3 rounding made the GPU's."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.engine_helpers import guard, interpreted, vllm_cache_files, vllm_v4_cache
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import metrics
from reference import cache_write, layouts
from reference.layout_table import layout
from tests.factories import make_case

ROOT = Path(__file__).resolve().parents[2]
V4 = dict(d_qk=512, d_v=512, model="v4-flash", page_size=16)
WRITE = dict(op="cache_write", batch_size=2, s_q=3, context_len=40, **V4)
DEQUANT = dict(op="dequant", batch_size=2, context_len=32, **V4)
PROVIDER = Provider("fake cache_utils", "0", "")


def _build() -> Path | None:
    place = vllm_v4_cache.PLACE
    folder = place.folder(None)
    return folder if folder is not None and place.missing_reason(None) is None else None


def _run(device: str) -> dict:
    """vllm_v4_cache_run in a process of its own: interpreted on the CPU, compiled on a GPU."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "tests.backends.vllm_v4_cache_run", str(_build()), device],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted_results():
    return _run("cpu")


NEEDS_BUILD = pytest.mark.skipif(
    _build() is None,
    reason="needs a vllm-triton build holding vLLM's deepseek_v4/v41 cache_utils.py: "
    "dsv4bench kernels fetch 'vllm[ops]'",
)
RAN = {
    "v4": ("cache_write-v4", "dequant-v4", "dequant-v4-one-request"),
    "v41": (
        "cache_write-v4", "cache_write-v41", "dequant-v4", "dequant-v4-one-request",
        "dequant-v41", "dequant-v41-fp4",
    ),
    "v41-one-pass": ("dequant-v4", "dequant-v4-one-request"),
}  # fmt: skip


def _assert_byte_exact_and_the_rest_declined(results: dict) -> None:
    for instance, labels in RAN.items():
        rows = results[instance]
        for label in labels:
            assert rows[label]["status"] == "ok" and rows[label]["mismatched"] == 0, (label, rows)
        declined = {k: r for k, r in rows.items() if k not in labels}
        assert all(r["status"] == "unsupported" and r["why"] for r in declined.values())
    assert results["v41"]["dequant-v4"]["gather"] == "per-block"
    assert results["v41-one-pass"]["dequant-v4"]["gather"] == "one-pass"
    assert results["v4"]["dequant-v4-one-request"]["requests"] == 1
    assert results["v4"]["dequant-v4"]["requests"] == 2


def _assert_the_vllm_convention(results: dict) -> None:
    found = results["conventions"]
    assert found["vllm"]["status"] == "ok" and found["vllm"]["mismatched"] == 0
    assert found["flashmla"]["mismatched"] > 0 and found["sglang"]["mismatched"] > 0


@pytest.mark.slow
@NEEDS_BUILD
def test_vllms_v4_writers_and_gathers_match_the_oracle_byte_for_byte(interpreted_results):
    _assert_byte_exact_and_the_rest_declined(interpreted_results)


@pytest.mark.slow
@NEEDS_BUILD
def test_vllms_v4_writer_uses_the_vllm_scale_convention(interpreted_results):
    _assert_the_vllm_convention(interpreted_results)


@pytest.mark.gpu
@NEEDS_BUILD
def test_on_a_gpu_vllms_v4_cache_ops_are_byte_exact_and_the_writer_is_the_vllm_convention():
    results = _run("cuda")
    _assert_byte_exact_and_the_rest_declined(results)
    _assert_the_vllm_convention(results)


# ---- the arguments as vLLM passes them (fakes) ---------------------------------------------


class FakeCacheUtils:
    """cache_utils.py's two entry points: each checks the arguments vLLM's wrapper relies on,
    then writes the oracle's answer (plus a stray byte past the output when `stray`)."""

    def __init__(self, layout_name: str, page_size: int, stray: bool = False):
        self.layout, self.page_size, self.stray, self.calls = layout_name, page_size, stray, []

    def quantize_and_insert_k_cache(self, k, k_cache, slot_mapping, block_size=64, **kw):
        self.calls.append(("write", kw))
        assert k.dtype == torch.bfloat16 and k.shape[1] == 512 and k.is_contiguous()
        assert slot_mapping.dtype == torch.int64 and int(slot_mapping[-1]) == -1
        assert block_size == self.page_size and k_cache.dim() == 2
        stride = k_cache.stride(0)
        view = torch.as_strided(
            k_cache, (k_cache.shape[0], block_size, 1, layout(self.layout).token_bytes),
            (stride, layout(self.layout).token_bytes, 1, 1), k_cache.storage_offset(),
        )  # fmt: skip
        written = cache_write.cache_write(k, slot_mapping, view, layout=self.layout)
        k_cache.copy_(torch.as_strided(written, k_cache.shape, k_cache.stride()))
        if self.stray:
            _one_past(k_cache)

    def dequantize_and_gather_k_cache(self, out, k_cache, seq_lens, gather_lens, table, bs, off):
        self.calls.append(("gather", {"requests": out.shape[0], "offset": off}))
        assert gather_lens is None and off == 0 and bs == self.page_size
        assert k_cache.shape[-1] == layout(self.layout).token_bytes and k_cache.dim() == 3
        assert table.dtype == seq_lens.dtype == torch.int32
        assert out.shape[0] == table.shape[0] == seq_lens.shape[0] and out.shape[2] == 512
        for r in range(out.shape[0]):
            slots = (table[r].long()[:, None] * bs + torch.arange(bs)).flatten()
            got = layouts.gather_tokens(k_cache[:, :, None], slots, layout=self.layout)
            out[r, : int(seq_lens[r])] = got.to(torch.bfloat16)
        if self.stray:
            _one_past(out)


def _one_past(t: torch.Tensor) -> None:
    flat = t.reshape(-1).view(torch.uint8)
    torch.as_strided(flat, (1,), (1,), flat.storage_offset() + flat.numel()).fill_(7)


def _backend(fake, **options) -> vllm_v4_cache.VllmV4Cache:
    return vllm_v4_cache.VllmV4Cache(ops=(PROVIDER, fake), **options)


def _judged(backend, case):
    x = make_inputs(case, "cpu")
    p = backend.prepare(case, x, "cpu")
    p.poison()
    return metrics.accuracy(oracle_call(case, x)(), p.finish(p.run())), p


@pytest.mark.parametrize(("model", "lay"), [("v4", "v4"), ("v41", "v4"), ("v41", "v41")])
def test_the_writer_gets_vllms_arguments_and_its_bytes_are_judged(model, lay):
    case = make_case(WRITE, layout=lay)
    fake = FakeCacheUtils(lay, case.page_size)
    acc, p = _judged(_backend(fake, model=model), case)
    assert acc["bytes_differ"] == 0 and acc["bytes_total"] > 0
    bytes_per_token = {"bytes_per_token": layout(lay).token_bytes} if model == "v41" else {}
    assert fake.calls[-1] == ("write", bytes_per_token)
    assert p.info["scale_convention"] == case.scale_convention


def test_a_v4_cache_reaches_the_writer_with_its_padded_page_stride():
    case = make_case(WRITE, layout="v4")
    seen = {}

    class Spy(FakeCacheUtils):
        def quantize_and_insert_k_cache(self, k, k_cache, slot_mapping, block_size=64, **kw):
            seen["stride"] = k_cache.stride(0)
            super().quantize_and_insert_k_cache(k, k_cache, slot_mapping, block_size, **kw)

    _judged(_backend(Spy("v4", 16)), case)
    assert seen["stride"] == layouts.v4_page_stride(16) == 17 * 576  # 16 * 584 rounded up


def test_a_writer_skipping_a_token_is_counted_in_bytes():
    class Lazy(FakeCacheUtils):
        def quantize_and_insert_k_cache(self, k, k_cache, slot_mapping, block_size=64, **kw):
            slot_mapping = slot_mapping.clone()
            slot_mapping[0] = -1
            super().quantize_and_insert_k_cache(k, k_cache, slot_mapping, block_size, **kw)

    acc, _ = _judged(_backend(Lazy("v4", 16)), make_case(WRITE, layout="v4"))
    assert 0 < acc["bytes_differ"] <= 584


@pytest.mark.parametrize(
    ("fields", "requests"), [({}, 2), ({"batch_size": 3, "context_len": 20}, 1)]
)
def test_the_gather_gets_one_request_per_batch_entry_where_pages_split_evenly(fields, requests):
    case = make_case(DEQUANT, layout="v41-fp4", **fields)
    fake = FakeCacheUtils("v41-fp4", 16)
    acc, p = _judged(_backend(fake, model="v41"), case)
    assert acc["mismatched"] == 0 and acc["cos_diff"] == 0
    assert fake.calls[-1] == ("gather", {"requests": requests, "offset": 0})
    assert p.info["requests"] == requests


@pytest.mark.parametrize("op", ["cache_write", "dequant"])
def test_a_kernel_writing_past_its_output_is_caught(op):
    case = make_case(WRITE if op == "cache_write" else DEQUANT, layout="v4")
    p = _backend(FakeCacheUtils("v4", 16, stray=True)).prepare(
        case, make_inputs(case, "cpu"), "cpu"
    )
    what = "its cache" if op == "cache_write" else "its workspace"
    with pytest.raises(guard.OutOfBounds, match=f"outside {what}: 1 of the 4096 guard bytes after"):
        p.finish(p.run())


# ---- what they decline -----------------------------------------------------------------------


def test_layouts_the_kernels_do_not_take_say_why():
    v4, v41 = _backend(None), _backend(None, model="v41")
    one_pass = _backend(None, model="v41", gather="one-pass")

    def why(backend, op, lay):
        return backend.supports(
            make_case(WRITE if op == "cache_write" else DEQUANT, layout=lay), "sm90"
        )

    assert "interleaved" in why(v41, "cache_write", "v41-blocks")
    assert "interleaved" in why(v41, "dequant", "v41-fp4-blocks")
    assert "fused with its compressor" in why(v41, "cache_write", "v41-fp4")
    assert "deepseek_v4 cache_utils.py writes v4 records only, not v41" in why(
        v4, "cache_write", "v41"
    )
    assert "gathers (one-pass) v4 records only" in why(one_pass, "dequant", "v41")
    assert "no cache_write kernel" in why(one_pass, "cache_write", "v4")
    v32 = make_case(op="dequant", d_qk=576, d_v=512, model="v3.2", layout="v32", page_size=64)
    assert "vllm-ops" in v4.supports(v32, "sm90")
    for backend, op, lay in [(v4, "cache_write", "v4"), (v41, "cache_write", "v41"),
                             (v41, "dequant", "v41-fp4"), (one_pass, "dequant", "v4")]:  # fmt: skip
        assert why(backend, op, lay) is None, (backend.model, op, lay)
    with pytest.raises(Unsupported, match="interleaved"):
        v41.prepare(make_case(DEQUANT, layout="v41-blocks"), {}, "cpu")


def test_options_are_checked():
    with pytest.raises(ValueError, match="model 'v5'"):
        vllm_v4_cache.VllmV4Cache(model="v5")
    with pytest.raises(ValueError, match="gather 'fast'"):
        vllm_v4_cache.VllmV4Cache(gather="fast")
    with pytest.raises(ValueError, match="deepseek_v41's cache_utils.py only"):
        vllm_v4_cache.VllmV4Cache(gather="one-pass")


def test_a_build_without_the_files_names_them_and_the_fetch(tmp_path):
    (tmp_path / "mla").mkdir()
    (tmp_path / "mla/sparse_utils.py").write_text("")  # a vllm-triton build from before them
    reason = vllm_v4_cache.VllmV4Cache(lib=str(tmp_path)).supports(
        make_case(WRITE, layout="v4"), "sm90"
    )
    assert "lacks vllm/models/deepseek_v4/common/ops/cache_utils.py" in reason
    assert "kernels fetch 'vllm[ops]'" in reason


# ---- the files' stubs ------------------------------------------------------------------------


def test_the_files_load_with_their_stubs_and_a_newer_import_is_the_reason(tmp_path):
    path = tmp_path / vllm_cache_files.FILES["v41"]
    path.parent.mkdir(parents=True)
    path.write_text(
        "from vllm.model_executor.warmup.jit_warmup import VllmJitKernel, zip_inputs\n"
        "from vllm.platforms import current_platform\n"
        "from vllm.utils.import_utils import has_cutedsl\n"
        "from vllm.utils.math_utils import cdiv, next_power_of_2\n"
        "ROWS = zip_inputs(dict(a=1), dict(a=2))\n"
        "FOUND = (has_cutedsl(), current_platform.is_rocm(), current_platform.is_fp8_fnuz(),\n"
        "         cdiv(7, 2), next_power_of_2(5), next_power_of_2(8))\n"
    )
    cuda = vllm_cache_files.cache_utils(tmp_path, "v41")
    rocm = vllm_cache_files.cache_utils(tmp_path, "v41", rocm=True)
    assert cuda.FOUND == (False, False, False, 4, 8, 8) and rocm.FOUND[1] is True
    assert "vllm" not in sys.modules
    newer = tmp_path / "newer" / vllm_cache_files.FILES["v4"]
    newer.parent.mkdir(parents=True)
    newer.write_text("from vllm.v2 import thing\n")
    with pytest.raises(Unsupported, match="load vLLM's cache_utils.py: .*imports more of vLLM"):
        vllm_cache_files.cache_utils(tmp_path / "newer", "v4")


# ---- the interpreter's e4m3 rounding ---------------------------------------------------------


@functools.cache
def _kernels():
    """Two tiny kernels, interpreted without TRITON_INTERPRET (InterpretedFunction)."""
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    @triton.jit
    def to_e4m3(x_ptr, out_ptr, N: tl.constexpr):
        d = tl.arange(0, N)
        tl.store(out_ptr + d, tl.load(x_ptr + d).to(tl.float8e4nv).to(tl.uint8, bitcast=True))

    @triton.jit
    def count_to(n_ptr, out_ptr):
        n = tl.load(n_ptr)
        total = 0
        for _ in range(0, n, 2):  # a loop bound loaded from memory, as vLLM's gathers have
            total += 1
        tl.store(out_ptr, total)

    return InterpretedFunction(to_e4m3.fn), InterpretedFunction(count_to.fn)


def _interpreted_e4m3(values: torch.Tensor, fixed: bool) -> torch.Tensor:
    from dsv4bench.backends.triton.jit import interpreting

    out = torch.zeros(values.numel(), dtype=torch.uint8)
    with interpreted.interpreted(True) if fixed else interpreting(True):
        _kernels()[0][(1,)](values, out, N=values.numel())
    return out


def test_the_interpreters_e4m3_rounding_is_made_the_gpus():
    # -125 and -127.5 round to -128 (a carry into the exponent), 9 and 11 are ties (to even: 8
    # and 12), 460 saturates at 448, 0.3 is an ordinary rounding
    values = torch.tensor([-125.0, -127.5, 9.0, 11.0, 460.0, 0.3, -0.0, 2.0**-9])
    want = values.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(_interpreted_e4m3(values, fixed=True), want)
    own = _interpreted_e4m3(values, fixed=False)  # Triton 3.6's own rounding
    assert own[0] == own[1] == 0xE8 and want[0] == want[1] == 0xF0  # -64, not -128
    bf16 = values.to(torch.bfloat16)
    got = interpreted.to_e4m3_bits(bf16.view(torch.int16).numpy().view("uint16"), "bf16")
    expected = bf16.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(torch.from_numpy(got), expected)


def test_a_loop_over_a_loaded_bound_runs_interpreted():
    out = torch.zeros(1, dtype=torch.int32)
    with interpreted.interpreted(True):
        _kernels()[1][(1,)](torch.tensor([5], dtype=torch.int32), out)
    assert int(out) == 3


def test_the_vllm_triton_build_lands_the_files_where_the_loaders_read_them(tmp_path):
    import zipfile

    from dsv4bench.backends.engine_helpers import vllm_files
    from dsv4bench.kernels import catalog, fetch

    (spec,) = [b for b in catalog.VLLM_OPS.builds if b.library == "vllm-triton"]
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for member in (*spec.members, "vllm/models/deepseek_v4/other.py"):
            z.writestr(member, f"# {member}\n")
    files = fetch.extract(wheel, spec, tmp_path / "build")
    landed = {f.path for f in files}
    assert landed == {vllm_files.SPARSE_UTILS, *vllm_cache_files.FILES.values()}
    assert all((tmp_path / "build" / p).is_file() for p in landed)
