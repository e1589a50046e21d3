"""The deepgemm backend against DeepGEMM's two metadata APIs: 2.5.0's (context_lens 2-D,
block_kv, num_sms), read from a pybind docstring as printed on the H100, and the older
(context_lens, num_sms); an unknown one is a one-line `unsupported`. On an sm90 GPU with
GPU, the real kernels in both forms against the oracle, once per DeepGEMM build of the kernels
folder (2.8.1 from vLLM 0.33.0, 2.5.0 from vLLM 0.26.0: tests/kernel_builds.py)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from dsv4bench.backends import Unsupported
from dsv4bench.backends import deepgemm as dgb
from dsv4bench.backends.deepgemm import DeepGEMM
from dsv4bench.backends.toolchains import library
from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.cases import indexer_case, inputs
from dsv4bench.measure import hardware
from dsv4bench.measure.metrics import accuracy
from dsv4bench.measure.topk import compare_topk
from dsv4bench.scenarios import load_text
from reference import indexer
from tests.kernel_builds import build_folder, build_params, expect_supported, ran_alone

# docstring first lines of DeepGEMM 2.5.0's pybind functions
# (results/sm90/studies/engine-kernels/probe.log)
DOC_V25 = (
    "get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: typing.SupportsInt, "
    "num_sms: typing.SupportsInt, indices: torch.Tensor | None = None) -> torch.Tensor"
)
DOC_OLD = "get_paged_mqa_logits_metadata(context_lens: torch.Tensor, num_sms: int) -> torch.Tensor"


def _case(model: str, extra: str, context_len: int = 300):
    text = f"""
    name: tiny
    op: indexer
    backends: [torch]
    defaults:
      num_heads: 16
      topk: 24
    cases:
      - model: {model}
        context_len: {context_len}
        {extra}
    """
    known = ("torch", "deepgemm")
    return load_text(textwrap.dedent(text), "x.yaml", known_backends=known).cases[0]


PAGED = {
    "v32-nextn2": ("v3.2", "batch_size: 2\n        s_q: 2"),
    "v4-2d-nextn3": ("v4-flash", "batch_size: 2\n        s_q: 3"),
}


class PybindFunction:
    """A callable that, like a pybind11 function, has no Python signature, only a docstring."""

    __signature__ = "pybind11"  # inspect.signature raises TypeError, as for the real ones

    def __init__(self, doc: str, fn):
        self.__doc__ = doc
        self._fn = fn

    def __call__(self, *args, **kw):
        return self._fn(*args, **kw)


class FakeDeepGEMM:
    """deep_gemm's indexer API of one version, computed by the oracle; records its calls."""

    def __init__(self, api: str):
        self.api = api
        self.__version__ = f"fake-{api}"
        self.calls = []
        doc = DOC_V25 if api == "2.5.0" else DOC_OLD
        self.get_paged_mqa_logits_metadata = PybindFunction(doc, self._metadata)

    def get_num_sms(self):
        return 132

    def _metadata(self, context_lens, *args):
        if self.api == "2.5.0":
            block_kv, num_sms = args
            assert context_lens.dim() == 2, "context_lens.dim() == 2"  # 2.5.0's assertion
            self.calls.append(("metadata", block_kv, num_sms))
        else:
            (num_sms,) = args
            self.calls.append(("metadata", num_sms))
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def fp8_paged_mqa_logits(self, q, kv, w, lens, table, sched, max_len, clean_logits=False):
        assert kv.dtype == torch.uint8
        if self.api == "2.5.0":  # refuses cleaning with 2-D lengths; leaves garbage past them
            assert not clean_logits, "not is_context_lens_2d"
        else:
            assert clean_logits
        self.calls.append(("paged", tuple(lens.shape)))
        out = indexer.paged_mqa_logits(q, kv, w, lens, table, max_len)
        return out if clean_logits else out.nan_to_num(neginf=7.0)

    def fp8_mqa_logits(self, q, kv, w, ks, ke):
        self.calls.append(("ragged", kv[0].shape[0]))
        return indexer.mqa_logits(q, kv, w, ks, ke)


@pytest.mark.parametrize("api", ["2.5.0", "old"])
@pytest.mark.parametrize("name", list(PAGED))
def test_paged_form_matches_the_oracle_on_either_api(api: str, name: str) -> None:
    case = _case(*PAGED[name])
    x = inputs.make_inputs(case, "cpu")
    fake = FakeDeepGEMM(api)
    p = DeepGEMM(fake).prepare(case, x, "cpu")
    got = p.finish(p.run())
    want = oracle_call(case, x)()
    acc = accuracy(want, got)
    assert acc["cos_diff"] < 1e-12 and acc["nonfinite"] == 0, acc
    assert compare_topk(want.out, want.topk, got.topk)["topk_matched"] == 1.0
    b, next_n = case.batch_size, case.s_q
    if api == "2.5.0":  # 2-D lengths always; the cache's block size as block_kv
        assert fake.calls[0] == ("metadata", case.page_size, 132)
        assert fake.calls[1] == ("paged", (b, next_n))
        assert p.info["context_lens"] == "2-D" and "block_kv" in p.info["metadata_api"]
        assert p.info["clean_logits"].startswith("masked after the call")
    else:
        assert fake.calls[0] == ("metadata", 132)
        assert p.info["metadata_api"].endswith("(context_lens, num_sms)")


def test_ragged_form_calls_fp8_mqa_logits() -> None:
    case = _case("v3.2", "tokens: 9", context_len=150)
    x = inputs.make_inputs(case, "cpu")
    fake = FakeDeepGEMM("2.5.0")
    p = DeepGEMM(fake).prepare(case, x, "cpu")
    got = p.finish(p.run())
    assert got.out.shape == (9, indexer_case.keys(case)) and fake.calls == [("ragged", 150)]
    assert p.info["kernel"] == "fp8_mqa_logits"


def test_an_unknown_metadata_api_is_unsupported_in_one_line() -> None:
    fake = FakeDeepGEMM("2.5.0")
    doc = "get_paged_mqa_logits_metadata(lens: torch.Tensor, sms: int, extra: int) -> torch.Tensor"
    fake.get_paged_mqa_logits_metadata = PybindFunction(doc, fake._metadata)
    case = _case(*PAGED["v32-nextn2"])
    with pytest.raises(Unsupported) as e:
        DeepGEMM(fake).prepare(case, inputs.make_inputs(case, "cpu"), "cpu")
    msg = str(e.value)
    assert "\n" not in msg and "unknown get_paged_mqa_logits_metadata(lens, sms, extra)" in msg


def test_params_reads_python_signatures_and_pybind_docstrings() -> None:
    def py(context_lens, block_kv, num_sms, indices=None):
        return None

    assert dgb.params(py) == ("context_lens", "block_kv", "num_sms", "indices")
    assert dgb.params(PybindFunction(DOC_V25, py)) == (
        "context_lens",
        "block_kv",
        "num_sms",
        "indices",
    )
    assert dgb.params(PybindFunction("no signature here", py)) is None


def test_a_missing_deepgemm_names_every_place_looked(monkeypatch, tmp_path) -> None:
    def absent(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(dgb.importlib, "import_module", absent)
    monkeypatch.setattr(library, "CHECKOUT", tmp_path)  # no .kernels tarball either
    with pytest.raises(Unsupported, match=r"deep_gemm.*vllm\.third_party\.deep_gemm"):
        DeepGEMM().provider()


# ---- GPU: the real kernels -----------------------------------------------------------------

GPU_POINTS = {
    "v32-paged-b16-nextn2-16k": "model: v3.2\n    batch_size: 16\n    s_q: 2\n"
    "    context_len: 16384",
    "v4-paged-2d-b16-nextn2-64k": "model: v4-flash\n    batch_size: 16\n    s_q: 2\n"
    "    context_len: 65536",
    "v32-ragged-2048-16k": "model: v3.2\n    tokens: 2048\n    context_len: 16384",
    "v4-ragged-4096-128k": "model: v4-flash\n    tokens: 4096\n    context_len: 131072",
}


@pytest.mark.gpu
@pytest.mark.parametrize("build", build_params("deepgemm"))
@pytest.mark.parametrize("name", list(GPU_POINTS))
def test_real_deepgemm_matches_the_oracle(request, name: str, build: str) -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("needs an sm90/sm100 GPU")
    if ran_alone(request, "deepgemm", build):
        return
    b = DeepGEMM(lib=build_folder(build))
    text = f"name: gpu\nop: indexer\nbackends: [deepgemm]\ncases:\n  - {GPU_POINTS[name]}\n"
    case = load_text(textwrap.dedent(text), "gpu.yaml", known_backends=("deepgemm",)).cases[0]
    expect_supported(build, b.supports(case, hardware.arch_of(0)))  # both forms, V3.2 and V4
    prov = b.provider()
    x = inputs.make_inputs(case, "cuda")
    want = oracle_call(case, x)()
    p = b.prepare(case, x, "cuda")
    got = p.finish(p.run())
    torch.cuda.synchronize()
    acc = accuracy(want, got)
    top = compare_topk(want.out, want.topk, got.topk, actual_logits=got.out)
    print(name, build, prov.version, p.info, acc["cos_diff"], top)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 1e-6, acc
    assert top["topk_matched"] == 1.0 and top["topk_invalid"] == 0, top


# ---- DeepGEMM 2.8.1 (vLLM 0.33.0): fp8_fp4_* forms, torch-op metadata, sm90 next_n ---------


class TorchOp:
    """A torch op as 2.8.1 binds it: no Python signature, a schema on `.default`."""

    class _Arg:
        def __init__(self, name):
            self.name = name

    def __init__(self, names: tuple[str, ...], fn):
        self.default = type("Overload", (), {})()
        self.default._schema = type("Schema", (), {"arguments": [self._Arg(n) for n in names]})()
        self._fn = fn

    def __call__(self, *args, **kw):
        return self._fn(*args, **kw)


class FakeDeepGEMM28:
    """DeepGEMM 2.8.1's indexer API computed by the oracle; tails past a row left as garbage."""

    __version__ = "2.8.1"

    def __init__(self):
        self.calls = []
        names = ("context_lens", "block_kv", "num_sms", "indices")
        self.get_paged_mqa_logits_metadata = TorchOp(names, self._metadata)

    def get_num_sms(self):
        return 132

    def _metadata(self, context_lens, block_kv, num_sms, indices=None):
        assert context_lens.dim() == 2
        self.calls.append(("metadata", block_kv, num_sms))
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def fp8_fp4_paged_mqa_logits(self, q, kv, w, lens, table, sched, max_len, indices=None):
        values, scales = q
        assert scales is None and kv.dtype == torch.uint8
        self.calls.append(("paged", tuple(lens.shape)))
        return indexer.paged_mqa_logits(values, kv, w, lens, table, max_len).nan_to_num(neginf=7.0)

    def fp8_fp4_mqa_logits(self, q, kv, w, ks, ke, max_seqlen_k, schedule_meta=None):
        values, scales = q
        assert scales is None
        self.calls.append(("ragged", max_seqlen_k))
        out = indexer.mqa_logits(values, kv, w, ks, ke, max_seqlen_k=max_seqlen_k)
        return out.nan_to_num(neginf=7.0)  # the tail is not cleaned


@pytest.mark.parametrize("name", list(PAGED))
def test_v28_paged_form_matches_the_oracle(name: str) -> None:
    case = _case(*PAGED[name])
    x = inputs.make_inputs(case, "cpu")
    fake = FakeDeepGEMM28()
    p = DeepGEMM(fake).prepare(case, x, "cpu")
    got = p.finish(p.run())
    want = oracle_call(case, x)()
    acc = accuracy(want, got)
    assert acc["cos_diff"] < 1e-12 and acc["nonfinite"] == 0, acc
    assert compare_topk(want.out, want.topk, got.topk)["topk_matched"] == 1.0
    assert fake.calls == [("metadata", case.page_size, 132), ("paged", (case.batch_size, case.s_q))]
    assert p.info["kernel"] == "fp8_fp4_paged_mqa_logits"


def test_v28_ragged_form_shifts_compressed_rows() -> None:
    case = _case("v3.2", "tokens: 9", context_len=150)
    x = inputs.make_inputs(case, "cpu")
    fake = FakeDeepGEMM28()
    p = DeepGEMM(fake).prepare(case, x, "cpu")
    got = p.finish(p.run())
    want = oracle_call(case, x)()
    assert got.out.shape == want.out.shape == (9, indexer_case.keys(case))
    assert accuracy(want, got)["cos_diff"] < 1e-12
    top = compare_topk(want.out, want.topk, got.topk)
    assert top["topk_matched"] == 1.0 and top["topk_invalid"] == 0, top
    width = int((x["ke"] - x["ks"]).max())
    assert fake.calls == [("ragged", width)] and p.info["kernel"] == "fp8_fp4_mqa_logits"


@pytest.mark.parametrize(
    "next_n, refused, slots", [(1, False, 132), (3, True, None), (4, False, 66)]
)
def test_v28_sm90_next_n(monkeypatch, next_n: int, refused: bool, slots: int | None) -> None:
    case = _case("v3.2", f"batch_size: 2\n        s_q: {next_n}")
    b = DeepGEMM(FakeDeepGEMM28())
    reason = b.supports(case, "sm90")
    assert (reason is not None) == refused
    assert b.supports(case, "sm100") is None  # sm100 schedules any next_n
    monkeypatch.setattr(dgb, "_device_arch", lambda device: "sm90")
    x = inputs.make_inputs(case, "cpu")
    if refused:
        assert "next_n 1, 2 or 4, not 3" in reason and "\n" not in reason
        with pytest.raises(Unsupported, match="DeepGEMM 2.8.1"):
            b.prepare(case, x, "cpu")
        return
    p = b.prepare(case, x, "cpu")  # at next_n 4 one task per 2-CTA cluster: half the SMs
    assert p.info["schedule_slots"] == slots


def test_an_unknown_api_is_unsupported_at_plan_time() -> None:
    class Bare:
        __version__ = "9.9.9"

        def get_num_sms(self):
            return 132

    case = _case(*PAGED["v32-nextn2"])
    b = DeepGEMM(Bare())
    reason = b.supports(case, "sm90")
    assert reason and "\n" not in reason
    assert "DeepGEMM 9.9.9" in reason and "fp8_paged_mqa_logits" in reason
    with pytest.raises(Unsupported, match="DeepGEMM 9.9.9"):
        b.prepare(case, inputs.make_inputs(case, "cpu"), "cpu")
    with pytest.raises(Unsupported, match="DeepGEMM 9.9.9"):  # the backends/plan line
        b.provider()


def test_v25_sm90_takes_the_same_next_n_with_half_the_sms_at_4(monkeypatch) -> None:
    three = _case("v3.2", "batch_size: 2\n        s_q: 3")
    reason = DeepGEMM(FakeDeepGEMM("2.5.0")).supports(three, "sm90")
    assert reason and "fp8_paged_mqa_logits takes next_n 1, 2 or 4, not 3" in reason
    four = _case("v3.2", "batch_size: 2\n        s_q: 4")
    fake = FakeDeepGEMM("2.5.0")
    monkeypatch.setattr(dgb, "_device_arch", lambda device: "sm90")
    p = DeepGEMM(fake).prepare(four, inputs.make_inputs(four, "cpu"), "cpu")
    assert p.info["schedule_slots"] == 66 and fake.calls[0] == ("metadata", four.page_size, 66)
