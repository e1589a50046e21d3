"""vLLM's `_C` ops backend (backends/engine_helpers/vllm_c.py) against fakes registered with
torch.library under the schemas vLLM 0.33.0's _C_stable_libtorch.abi3.so registers (the strings
below, as `strings` prints them from the binary): argument handling, guard bytes, the schema
check, the load failure's reason. A fake proves argument handling only; the rows of the real
library come from the GPU (scenarios/sm90/dsa_helpers.yaml)."""

from __future__ import annotations

import itertools

import pytest
import torch

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.engine_helpers import guard, vllm_c
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import judge, metrics
from reference import layouts_indexer
from reference.cache_write import encode
from reference.layouts import gather_tokens
from tests.factories import make_case

# as in the binary (whitespace included)
BINARY = {
    "concat_and_cache_mla": "concat_and_cache_mla(Tensor kv_c, Tensor k_pe,                     "
    "Tensor! kv_cache,                     Tensor slot_mapping,                     str "
    "kv_cache_dtype,                     Tensor scale,                     bool "
    "skip_scale=False) -> ()",
    "cp_gather_and_upconvert_fp8_kv_cache": "cp_gather_and_upconvert_fp8_kv_cache(Tensor "
    "src_cache, Tensor! dst, Tensor block_table, Tensor workspace_starts, int batch_size, "
    "Tensor? seq_starts, Tensor? host_cache=None, Tensor? host_row_ids=None, Tensor? "
    "device_row_ids=None) -> ()",
    "indexer_k_quant_and_cache": "indexer_k_quant_and_cache(Tensor k, Tensor! kv_cache, Tensor "
    "slot_mapping, int quant_block_size, str kv_cache_dtype) -> ()",
    "cp_gather_indexer_k_quant_cache": "cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor! "
    "dst_k, Tensor! dst_scale, Tensor block_table, Tensor cu_seq_lens) -> ()",
    "cp_gather_and_upconvert_nvfp4_kv_cache": "cp_gather_and_upconvert_nvfp4_kv_cache(Tensor "
    "src_cache, Tensor! dst, Tensor block_table, Tensor workspace_starts, int batch_size) -> ()",
    "top_k_per_row_decode": "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, "
    "Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()",
    "top_k_per_row_prefill": "top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor "
    "rowEnds, Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()",
}
V32 = dict(d_qk=576, d_v=512, model="v3.2", layout="v32")
_COUNT = itertools.count()


def _concat(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False):
    assert kv_cache_dtype == "fp8_ds_mla" and kv_cache.dim() == 3 and not skip_scale
    keep = slot_mapping >= 0
    records = encode(torch.cat([kv_c, k_pe], -1)[keep], "v32", "pow2")  # as on the H100
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    flat[slot_mapping[keep]] = records
    if FAKE["stray_byte"]:  # one byte past the cache's end
        torch.as_strided(flat, (1,), (1,), flat.storage_offset() + flat.numel()).fill_(1)


def _gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, *rest):
    # csrc cache_kernels.cu: request r's rows run from workspace_starts[r] to the next
    # request's start, the last one's to dst.size(0); its positions from 0 (no seq_starts)
    assert seq_starts is None and batch_size == len(workspace_starts) == len(block_table)
    assert block_table.dtype == workspace_starts.dtype == torch.int32
    pages, page_size, width = src_cache.shape
    cache = src_cache.view(pages, page_size, 1, width)
    ends = workspace_starts.tolist()[1:] + [dst.shape[0] - FAKE["short_last"]]
    for r, (start, end) in enumerate(zip(workspace_starts.tolist(), ends, strict=True)):
        pos = torch.arange(end - start)
        slots = block_table[r].long()[pos // page_size] * page_size + pos % page_size
        dst[start:end] = gather_tokens(cache, slots, layout="v32").to(torch.bfloat16)
    if FAKE["stray_byte"]:  # one row past the chunk's workspace
        torch.as_strided(dst, (1,), (1,), dst.storage_offset() + dst.numel()).fill_(1.0)


def _indexer_write(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype):
    assert quant_block_size == k.shape[1] == 128 and k.dtype == torch.bfloat16
    assert kv_cache.dim() == 3 and kv_cache_dtype in ("ue8m0", "")
    keep = slot_mapping >= 0
    page_size = kv_cache.shape[1]
    records = encode(k[keep], "indexer-fp8", kv_cache_dtype or "raw")
    data, scales = layouts_indexer.record_views(kv_cache.view(*kv_cache.shape[:2], 1, -1))
    page, offset = slot_mapping[keep] // page_size, slot_mapping[keep] % page_size
    data[page, offset] = records[:, :128]
    scales[page, offset] = records[:, 128:]


def _indexer_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
    # csrc: batch_size = block_table.size(0); token t of request b at cu_seq_lens[b] + i
    assert dst_k.dtype == torch.float8_e4m3fn and dst_scale.shape == (len(dst_k), 4)
    assert cu_seq_lens.dtype == block_table.dtype == torch.int32
    assert len(cu_seq_lens) == len(block_table) + 1
    cache = kv_cache.view(*kv_cache.shape[:2], 1, -1)
    page_size, cu = kv_cache.shape[1], cu_seq_lens.tolist()
    for b in range(len(block_table)):
        for i in range(cu[b + 1] - cu[b]):
            slot = int(block_table[b, i // page_size]) * page_size + i % page_size
            record = layouts_indexer.records(cache, torch.tensor([slot]))[0]
            dst_k.view(torch.uint8)[cu[b] + i] = record[:128]
            dst_scale[cu[b] + i] = record[128:]


def _decode_topk(logits, next_n, seq_lens, indices, num_rows, stride0, stride1, k):
    assert next_n == 1 and logits.stride() == (stride0, stride1) and num_rows == len(indices)
    for r in range(num_rows):
        n = int(seq_lens[r])
        picks = logits[r, :n].topk(min(k, n)).indices.int()
        indices[r] = -1
        indices[r, : len(picks)] = picks


def _prefill_topk(logits, starts, ends, indices, num_rows, stride0, stride1, k):
    raise AssertionError("not called by a decode case")


def _nvfp4(src_cache, dst, block_table, workspace_starts, batch_size):
    raise AssertionError("never called: no oracle layout")


FAKE = {"stray_byte": False, "short_last": 0}
IMPLS = {
    "concat_and_cache_mla": _concat,
    "cp_gather_and_upconvert_fp8_kv_cache": _gather,
    "indexer_k_quant_and_cache": _indexer_write,
    "cp_gather_indexer_k_quant_cache": _indexer_gather,
    "cp_gather_and_upconvert_nvfp4_kv_cache": _nvfp4,
    "top_k_per_row_decode": _decode_topk,
    "top_k_per_row_prefill": _prefill_topk,
}


@pytest.fixture
def fake_ops():
    """(Provider, table) over fresh namespaces holding the binary's schemas and the fakes."""
    n = next(_COUNT)
    libs = {ns: torch.library.Library(f"dsvfake{n}{ns}", "DEF") for ns in ("_C_cache_ops", "_C")}
    for name, schema in BINARY.items():
        ns = "_C" if name.startswith("top_k") else "_C_cache_ops"
        libs[ns].define(schema)
        libs[ns].impl(name, IMPLS[name], "CompositeExplicitAutograd")

    def table(qualified: str):
        ns, name = qualified.split(".")
        return getattr(getattr(torch.ops, f"dsvfake{n}{ns}"), name)

    FAKE.update(stray_byte=False, short_last=0)
    yield Provider("fake vllm _C"), table
    FAKE.update(stray_byte=False, short_last=0)


def _verdict(backend, case):
    x = make_inputs(case, "cpu")
    p = backend.prepare(case, x, "cpu")
    p.poison()
    got = p.finish(p.run())
    if case.op == "topk":
        from dsv4bench.measure import topk

        acc = topk.compare_forms(case, x, oracle_call(case, x)(), got)
    else:
        acc = metrics.accuracy(oracle_call(case, x)(), got)
    return judge.verdict(acc, case.tolerance), p.info


def test_the_writer_is_called_as_vllm_calls_it(fake_ops):
    # vLLM 0.33.0's writer matched the pow2 convention byte for byte on the H100
    # (results/sm90/studies/dsa-helpers); raw fp32 scales (amax / 448) differ, counted
    case = make_case(op="cache_write", batch_size=2, s_q=3, context_len=40, page_size=16, **V32)
    (status, why), info = _verdict(vllm_c.VllmOps(ops=fake_ops), case)
    assert (status, why) == ("ok", "") and "fp8_ds_mla" in info["kernel"]
    raw = make_case(op="cache_write", batch_size=2, s_q=3, context_len=40, page_size=16,
                    scale_convention="raw", **V32)  # fmt: skip
    (status, why), _ = _verdict(vllm_c.VllmOps(ops=fake_ops), raw)
    assert status == "incorrect" and "cache bytes differ" in why


def test_a_writer_that_writes_one_byte_past_the_cache_is_caught(fake_ops):
    FAKE["stray_byte"] = True
    case = make_case(op="cache_write", batch_size=1, s_q=2, context_len=32, page_size=16,
                     scale_convention="raw", **V32)  # fmt: skip
    with pytest.raises(guard.OutOfBounds, match="outside its cache: 1 of the 4096 guard bytes"):
        _verdict(vllm_c.VllmOps(ops=fake_ops), case)


def test_gather_and_upconvert_and_the_decode_topk(fake_ops):
    dequant = make_case(op="dequant", batch_size=2, context_len=64, page_size=16, **V32)
    assert _verdict(vllm_c.VllmOps(ops=fake_ops), dequant)[0] == ("ok", "")
    topk = make_case(op="topk", topk=32, batch_size=2, s_q=2, context_len=256, form="plain",
                     **V32)  # fmt: skip
    (verdict, info) = _verdict(vllm_c.VllmOps(ops=fake_ops), topk)
    assert verdict == ("ok", "") and "top_k_per_row_decode" in info["kernel"]


def test_a_changed_schema_and_a_library_that_does_not_load_are_unsupported(fake_ops, tmp_path):
    provider, table = fake_ops
    n = next(_COUNT)
    lib = torch.library.Library(f"dsvfake{n}_C_cache_ops", "DEF")
    lib.define("concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor! kv_cache) -> ()")

    def changed(name: str):
        return getattr(getattr(torch.ops, f"dsvfake{n}_C_cache_ops"), name.split(".")[1])

    case = make_case(op="cache_write", s_q=1, context_len=32, page_size=16, **V32)
    with pytest.raises(Unsupported, match="concat_and_cache_mla schema changed"):
        vllm_c.VllmOps(ops=(provider, changed)).prepare(case, make_inputs(case, "cpu"), "cpu")
    (tmp_path / vllm_c.SO).write_bytes(b"not a library")
    backend = vllm_c.VllmOps(lib=str(tmp_path))
    with pytest.raises(Unsupported, match=r"does not load here \(torch .*\): .*"):
        backend.kernel_ops()
    assert "vllm-ops" in vllm_c.PLACE.glob and backend.supports(case, "sm90") is None


def test_the_schemas_checked_are_the_binarys():
    for name, schema in BINARY.items():
        ns = "_C" if name.startswith("top_k") else "_C_cache_ops"
        assert vllm_c.canonical(vllm_c.SCHEMAS[f"{ns}.{name}"]) == vllm_c.canonical(schema)


def test_what_it_declines():
    ops = vllm_c.VllmOps(ops=(Provider("x"), None))
    ragged = make_case(op="topk", topk=32, tokens=16, context_len=256, form="ragged", **V32)
    assert "form plain" in ops.supports(ragged, "sm90")
    v4 = make_case(op="cache_write", layout="v4", d_qk=512, d_v=512, model="v4-flash", s_q=1)
    assert "v4" in ops.supports(v4, "sm90")
    persistent = vllm_c.VllmOps(kernel="persistent", ops=(Provider("x"), None))
    plain = make_case(op="topk", topk=32, batch_size=2, context_len=256, form="plain", **V32)
    assert "k 512, 1024 or 2048" in persistent.supports(plain, "sm90")


def test_cooperative_topk_declines_more_than_its_64_rows_beforehand():
    # vLLM 0.33.0's cooperative_topk raised "supports <=64 rows" on a 2048-row chunk on the
    # H100 (results/sm90/studies/dsa-helpers): an error row for a limit the adapter knows
    cooperative = vllm_c.VllmOps(kernel="cooperative", ops=(Provider("x"), None))
    persistent = vllm_c.VllmOps(kernel="persistent", ops=(Provider("x"), None))
    chunk = make_case(op="topk", topk=512, tokens=65, context_len=1024, form="plain", **V32)
    decode = make_case(op="topk", topk=512, batch_size=64, context_len=1024, form="plain", **V32)
    assert "at most 64 rows, not 65" in cooperative.case_reason(chunk)
    assert cooperative.case_reason(decode) is None
    assert persistent.case_reason(chunk) is None


def test_the_topk_instances_time_only_the_topk():
    # the persistent/cooperative instances ran vllm-ops's cache_write and dequant again
    # (the same kernels, duplicate rows): they declare the top-k alone
    for kernel in ("persistent", "cooperative"):
        backend = vllm_c.VllmOps(kernel=kernel, ops=(Provider("x"), None))
        dequant = make_case(op="dequant", batch_size=1, context_len=256, **V32)
        assert "has no dequant kernel (has: topk)" in backend.supports(dequant, "sm90")
    per_row = vllm_c.VllmOps(ops=(Provider("x"), None))
    assert per_row.ops == ("cache_write", "dequant", "topk")


INDEXER = dict(model="v3.2", d_qk=128, d_v=128, num_heads=1, layout="indexer-fp8")
# ragged contexts over a workspace of 5 x 32 = 160 rows: chunks [0, 5) (150 rows), [5, 8)
RAGGED = dict(tokens=8, context_len=32, page_size=16, batch_size=8,
              context_lens=(32, 30, 32, 24, 32, 17, 32, 9))  # fmt: skip


def test_the_indexer_writer_is_called_as_vllm_calls_it(fake_ops):
    ops = vllm_c.VllmOps(ops=fake_ops)
    for convention in ("ue8m0", "raw"):
        case = make_case(op="cache_write", batch_size=2, s_q=5, context_len=40, page_size=16,
                         scale_convention=convention, **INDEXER)  # fmt: skip
        (verdict, info) = _verdict(ops, case)
        assert verdict == ("ok", "")
        assert f"indexer_k_quant_and_cache ({convention})" in info["kernel"]


def test_the_indexer_gather_whole_and_chunked(fake_ops):
    ops = vllm_c.VllmOps(ops=fake_ops)
    whole = make_case(op="dequant", batch_size=2, context_len=48, page_size=16, **INDEXER)
    assert _verdict(ops, whole)[0] == ("ok", "")
    chunked = make_case(op="dequant", **RAGGED, **INDEXER)
    (verdict, info) = _verdict(ops, chunked)
    assert verdict == ("ok", "") and info["chunks"] == 2
    x = make_inputs(chunked, "cpu")
    assert oracle_call(chunked, x)().out.shape == (sum(RAGGED["context_lens"]), 132)


def test_chunked_gather_and_upconvert_as_flashmla_sparse_calls_it(fake_ops):
    case = make_case(op="dequant", **RAGGED, **V32)
    x = make_inputs(case, "cpu")
    assert x["chunk_bounds"].tolist() == [[0, 5], [5, 8]]
    assert x["workspace_starts"].tolist() == [0, 32, 62, 94, 118, 0, 17, 49]
    (verdict, info) = _verdict(vllm_c.VllmOps(ops=fake_ops), case)
    assert verdict == ("ok", "") and (info["chunks"], info["requests"]) == (2, 8)
    p = vllm_c.VllmOps(ops=fake_ops).prepare(case, x, "cpu")
    acc = metrics.accuracy(oracle_call(case, x)(), p.finish(p.run()))
    assert (acc["cos_diff"], acc["max_abs"], acc["mismatched"]) == (0.0, 0.0, 0)


def test_a_gather_that_misses_a_row_or_writes_past_its_chunk_is_caught(fake_ops):
    case = make_case(op="dequant", **RAGGED, **V32)
    FAKE["short_last"] = 1  # each chunk's last request one row short: its row stays NaN
    (status, why), _ = _verdict(vllm_c.VllmOps(ops=fake_ops), case)
    assert status == "incorrect" and "non-finite" in why
    FAKE.update(short_last=0, stray_byte=True)
    with pytest.raises(guard.OutOfBounds, match="outside its workspace"):
        _verdict(vllm_c.VllmOps(ops=fake_ops), case)


def test_the_nvfp4_gather_names_why_it_has_no_rows():
    ops = vllm_c.VllmOps(ops=(Provider("x"), None))
    fp4 = make_case(op="dequant", layout="v41-fp4", d_qk=512, d_v=512, model="v4-flash",
                    page_size=256, batch_size=1, context_len=256)  # fmt: skip
    why = ops.supports(fp4, "sm90")
    assert "352 B" in why and "requires SM100" in why


def test_a_dequant_that_gathers_every_slot_declines_the_chunked_form():
    from dsv4bench.backends import registry

    chunked = make_case(op="dequant", **RAGGED, **V32)
    whole = make_case(op="dequant", batch_size=1, context_len=64, page_size=16, **V32)
    for name, arch in (("triton", "sm90"), ("reference-f64", "cpu")):
        backend = registry.get(name)
        assert "not vLLM's chunked prefill form" in backend.supports(chunked, arch)
        assert "chunked" not in (backend.supports(whole, arch) or "")
    assert registry.get("torch").supports(chunked, "cpu") is None
