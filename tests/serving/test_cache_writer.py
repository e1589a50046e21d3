"""The KV-cache writer in TTFT/TPOT (spec key cache_write): its jobs, its part once per layer,
the engine's scale convention, and the rows where no helper backend writes the layout."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dsv4bench import serving as sv
from dsv4bench.report.sections import serving as report_serving
from tests.factories import case_row

K = 1024
ENGINE = ["vllm-ops-0.33.0", "sglang-ops-0.5.23", "vllm-triton-0.33.0"]  # the sm90 file's
WRITER_KERNEL = "vllm concat_and_cache_mla (fp8_ds_mla)"


def _spec(**kw) -> sv.ServingSpec:
    d = {"model": "v3.2", "backends": ["kern"], "helper_backends": ENGINE}
    d.update(kw)
    return sv.spec_from_dict(d)


def _v32(**kw) -> sv.ServingSpec:
    base = dict(prompt_lens=[8 * K], chunk_sizes=[4096], routes=["sparse-prefill", "decode-kernel"])
    return _spec(**base, batch_sizes=[32], contexts=[8 * K], **kw)


def _writers(point) -> list:
    return [p for p in point.parts if p.role == "cache_write"]


def test_the_plan_writes_every_chunks_tokens_and_every_steps_token_per_request_in_each_layer():
    off, on = sv.plan(_v32()), sv.plan(_v32(cache_write=True))
    assert not [c for c in off.cases if c.op == "cache_write"]
    assert not [p for pt in off.points() for p in _writers(pt)]
    by_route = {pt.route: pt for pt in on.points()}
    for route in ("sparse-prefill", "decode-kernel"):  # two chunks of 4096 tokens, 61 layers
        (part,) = _writers(by_route[route])
        case = on.case(part.case_id)
        assert (case.batch_size, case.s_q, case.query_tokens) == (1, 4096, 4096)
        assert part.multiplicity == 2 * 61
    (part,) = _writers(by_route["decode"])  # one token for each of 32 requests, 61 layers
    case = on.case(part.case_id)
    assert (case.batch_size, case.s_q, case.query_tokens, part.multiplicity) == (32, 1, 32, 61)
    for pt in on.points():  # everything else as without the writer
        twin = next(x for x in off.points() if x.point_id == pt.point_id)
        assert [p for p in pt.parts if p.role != "cache_write"] == twin.parts
        assert pt.workspace_bytes == twin.workspace_bytes  # the writer writes the cache itself
    writes = [c for c in on.cases if c.op == "cache_write"]
    # vLLM's fp8_ds_mla writer is the only one of the three helper backends; pow2 is its bytes
    assert {c.scale_convention for c in writes} == {"pow2"} and on.writer_backends == (ENGINE[0],)
    jobs = [(c.op, b) for c, b in on.jobs() if c.op == "cache_write"]
    assert jobs == [("cache_write", ENGINE[0])] * len(writes)
    assert on.summary()["cases_by_op"]["cache_write"] == 2
    raw = sv.plan(_v32(cache_write=True, scale_convention="raw"))  # what attention reads
    assert {c.scale_convention for c in raw.cases if c.op == "cache_write"} == {"pow2"}


def test_v4s_writer_is_vllms_triton_one_in_the_vllm_convention():
    spec = _spec(
        model="v4-flash",
        helper_backends=["vllm-ops-0.33.0", "vllm-v4-cache", "triton"],
        batch_sizes=[4],
        contexts=[8 * K],
        cache_write=True,
    )
    p = sv.plan(spec)
    assert p.writer_backends == ("vllm-v4-cache",)
    (part,) = _writers(p.points()[0])
    assert part.multiplicity == 43 and p.case(part.case_id).scale_convention == "vllm"


def _rows(p, writer_ms: float | None) -> list[dict]:
    rows = []
    for c in p.cases:
        if c.op in ("prefill", "decode"):
            rows.append(case_row(c.case_id, "kern", 1.0))
        elif c.op == "cache_write":
            if writer_ms is not None:
                rows.append(
                    case_row(c.case_id, ENGINE[0], writer_ms, info={"kernel": WRITER_KERNEL})
                )
        else:
            rows.append(case_row(c.case_id, "torch", 0.25))
    return rows


def test_ttft_and_tpot_sum_the_writer_once_per_layer_and_name_its_kernel():
    with_writer = sv.plan(_v32(cache_write=True))
    without = sv.plan(_v32())
    plain = {r["case_id"]: r for r in sv.aggregate(without, _rows(without, None))}
    rows = sv.aggregate(with_writer, _rows(with_writer, 0.01))
    assert {r["metric"] for r in rows} == {"ttft", "tpot"}
    for r in rows:
        assert r["status"] == "ok" and r["message"] == ""
        layers_x_calls = 61 if r["metric"] == "tpot" else 2 * 61
        assert r["breakdown_ms"]["cache_write"] == pytest.approx(0.01 * layers_x_calls)
        base = plain[r["case_id"]]
        assert r["value_ms"] == pytest.approx(base["value_ms"] + 0.01 * layers_x_calls)
        assert "cache_write" not in base["breakdown_ms"]  # rows without it keep their keys
        (part,) = [x for x in r["parts"] if x["role"] == "cache_write"]
        assert (part["backend"], part["kernel"]) == (ENGINE[0], WRITER_KERNEL)
        assert f"cache_write: {ENGINE[0]} ({WRITER_KERNEL})" in report_serving._helpers(r)
    missing = sv.aggregate(with_writer, _rows(with_writer, None))  # the writer never ran
    assert {r["status"] for r in missing} == {"missing"}
    assert all("cache_write" in r["message"] for r in missing)


def test_no_helper_backend_that_writes_the_layout_means_no_writer_part_and_the_row_says_so():
    spec = _v32(cache_write=True, helper_backends=["triton", "sglang-ops-0.5.23"])
    p = sv.plan(spec)
    assert p.writer_backends == () and not [c for c in p.cases if c.op == "cache_write"]
    assert not [x for pt in p.points() for x in _writers(pt)]
    plain = sv.plan(dataclasses.replace(spec, cache_write=False))
    assert [pt.parts for pt in p.points()] == [pt.parts for pt in plain.points()]
    rows = sv.aggregate(p, _rows(p, None))
    assert {r["status"] for r in rows} == {"ok"}
    for r in rows:
        assert r["message"] == (
            "no cache writer part: none of helper_backends (triton, sglang-ops-0.5.23) "
            "writes a v32 cache (cache_write)"
        )
    assert all(r["message"] == "" for r in sv.aggregate(plain, _rows(plain, None)))


def test_cache_write_takes_true_or_false():
    with pytest.raises(ValueError, match="cache_write: expected true or false"):
        _spec(batch_sizes=[1], contexts=[4096], cache_write="yes")


def test_a_cpu_run_sums_the_writer_its_backend_names(tmp_path, run_cli):
    scenario = tmp_path / "writer.yaml"
    scenario.write_text(
        "op: serving\nname: serving-writer\nmodel: v3.2\nnum_heads: 16\n"
        "prompt_lens: [128]\nchunk_sizes: [64]\nroutes: [decode-kernel]\n"
        "batch_sizes: [2]\ncontexts: [128]\nbackends: [torch]\n"
        "helper_backends: [named-writer]\ncache_write: true\n"
        "timing: {warmup: 1, iters: 2, flush_l2: false}\n"
    )
    plugin = "tests.plugins.named_writer"
    code, out, err = run_cli("plan", scenario, "--arch", "cpu", "--plugin", plugin)
    assert code == 0, err
    writes = [line.split() for line in out.splitlines() if line.startswith("cache_write-")]
    assert [w[1] for w in writes] == ["named-writer", "named-writer"]  # 64 tokens; 2 requests
    code, _, err = run_cli(
        "run", scenario, "--out", tmp_path / "out", "--quiet", "--plugin", plugin
    )
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").open()]
    serving = [r for r in rows if r.get("kind") == "serving"]
    assert {r["metric"] for r in serving} == {"ttft", "tpot"}
    for r in serving:
        assert r["status"] == "ok", r["message"]
        (part,) = [x for x in r["parts"] if x["role"] == "cache_write"]
        assert part["backend"] == "named-writer" and part["kernel"].startswith("test writer")
        assert part["multiplicity"] == (2 * 61 if r["metric"] == "ttft" else 61)


def test_a_ragged_step_writes_one_token_per_request_in_each_layer():
    from dsv4bench.cases.lengths import explicit

    p = sv.plan(_spec(ragged=[explicit([300, 5000, 1200])], cache_write=True))
    (point,) = p.points()
    (part,) = _writers(point)
    case = p.case(part.case_id)
    assert (case.batch_size, case.query_tokens, part.multiplicity) == (3, 3, 61)
