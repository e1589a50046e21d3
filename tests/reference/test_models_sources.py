"""The new models' numbers against the engines' code they were read from (quoted here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference.layout_table import LAYOUTS
from reference.models import MODELS, ModelConfig, sourced

# vllm/models/deepseek_v41/amd/mono/attention/plan.py (vLLM 0.33.0):
#   HEAD_DIM = 512, ROPE = 64, N_HEADS = 64, WINDOW = 128, TOPK = 512
# vllm/models/deepseek_v41/sparse_mla.py (vLLM 0.33.0): _V41_LAYER_TYPES keys 0, 1, 2; (vLLM
# main, 02ee13b): get_supported_kernel_block_sizes -> [64] on SM90; attention.py (the same):
# self.scale = self.head_dim**-0.5
V41 = dict(
    d_qk=512, d_rope=64, num_heads=64, window=128, index_topk=512, ratio_kinds=(0, 1, 2),
    page_size=64, softmax_scale=512**-0.5, d_v=512,
)  # fmt: skip
# sglang/srt/layers/attention/dsa_backend.py (sglang 0.5.23): "GLM-5 64 heads / TP8 = 8";
# GLM-5.2 is DeepseekV32ForCausalLM (vllm/models/deepseek_v32/__init__.py, vLLM 0.33.0)
GLM52 = dict(num_heads=64, d_qk=576, d_rope=64, index_topk=2048, cache_layout="v32")
# sglang/kernels/ops/attention/dsa/transform_index.py (sglang 0.5.23): "index_topk +
# index_kpool - 1 is 2051 for GLM-5.3-Flash"; flashinfer_mla_sparse_sm90.py (vLLM 0.33.0):
# head_dim_kpe=0; flash_mla_interface.py (sglang 0.5.23): V32_NO_ROPE is 528 bytes a token
GLM53F = dict(d_qk=512, d_v=512, d_rope=0, index_topk=2051 - 4 + 1, cache_layout="v32-nope")


@pytest.mark.parametrize(
    "name, want", [("v4.1", V41), ("glm-5.2", GLM52), ("glm-5.3-flash", GLM53F)]
)
def test_numbers_match_the_cited_sources(name, want):
    m = MODELS[name]
    assert {k: getattr(m, k) for k in want} == want


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_field_of_every_model_has_a_source_line(name):
    m = MODELS[name]
    named = [f for f, _ in m.sources]
    assert sorted(named) == sorted(sourced()), f"{name}: fields without a source line or unknown"
    assert len(named) == len(set(named))
    cited = ("(vLLM 0.33.0)", "(sglang 0.5.23)", "commit 02ee13b", "issue", "docs/kernel-facts.md")
    # a value no engine code holds says so ("unknown ...") instead of naming a file
    for field in sourced():
        line = m.source(field)
        assert any(c in line for c in cited) or line.startswith("unknown"), (field, line)


def test_a_field_without_a_source_line_is_caught():
    m = MODELS["v4.1"]
    fewer = ModelConfig(**{**vars(m), "sources": m.sources[1:]})
    assert sorted(f for f, _ in fewer.sources) != sorted(sourced())
    with pytest.raises(KeyError):
        fewer.source(m.sources[0][0])
    assert "num_layers" in sourced() and "name" not in sourced() and "sources" not in sourced()


def test_v41_top_k_is_the_engine_constant_and_the_issue_width_is_in_the_envelope():
    from dsv4bench import backends, scenarios

    line = MODELS["v4.1"].source("index_topk")
    assert line.startswith("512, TOPK") and "56837" in line and "1152" in line
    # the issue's decode call, 128 window + 1024 compressed entries at 64 heads, is a cell
    path = Path(__file__).parents[2] / "scenarios/envelope/sm90.yaml"
    sc = scenarios.load(path, known_backends=backends.catalog())
    assert any(
        c.op == "decode" and c.layout == "v4" and c.num_heads == 64
        and c.topk + c.extra_topk == 1152
        for c in scenarios.expand(sc)
    )  # fmt: skip


def test_v41_is_served_on_hopper_from_the_v4_record():
    # vllm/models/deepseek_v41/attention.py (vLLM 0.33.0): `_use_v41_mxfp8_kv_record` is the
    # sm100 family only; every other arch keeps the 584-byte V4 record
    assert LAYOUTS[MODELS["v4.1"].cache_layout].token_bytes == 584
    assert LAYOUTS["v41"].token_bytes == 528 and LAYOUTS["v41-fp4"].token_bytes == 288
    assert LAYOUTS[MODELS["glm-5.3-flash"].cache_layout].token_bytes == 528


def test_a_model_without_its_layer_list_has_no_layer_kinds():
    for name in ("v4.1", "glm-5.2", "glm-5.3-flash"):
        assert not MODELS[name].layers_known
        with pytest.raises(ValueError, match="checkpoint"):
            MODELS[name].layer_kinds()
    assert MODELS["v4-flash"].layer_kinds() == {"window": 2, "c4": 21, "c128": 20}


def test_plan_accepts_the_new_models_with_mtp_and_draft_topk(tmp_path, capsys):
    from dsv4bench.cli import main

    f = tmp_path / "s.yaml"
    f.write_text(
        "name: new-models\nop: decode\narch: [sm90]\nbackends: [torch]\n"
        "defaults: {context_len: 4096}\n"
        "cases:\n"
        "  - {model: v4.1, s_q: [1, 2, 4, 8], compress_ratio: 4, extra_topk: [192, 256]}\n"
        "  - {model: glm-5.2, num_heads: 8, s_q: 8, topk: [192, 256]}\n"
        "  - {model: glm-5.3-flash, s_q: 8, topk: 2048}\n"
    )
    assert main(["plan", str(f), "--arch", "sm90"]) == 0
    out = capsys.readouterr().out
    assert "11 jobs" in out and "unsupported" not in out


def test_serving_refuses_a_model_without_its_layer_list():
    from dsv4bench.scenarios.serving_spec import ServingSpec

    with pytest.raises(ValueError, match="per-layer"):
        ServingSpec(model="v4.1", batch_sizes=[1], contexts=[64]).validate()
