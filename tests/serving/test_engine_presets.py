"""Engine presets and `dsv4bench recommend` on synthetic serving rows: KV-dtype candidates (a
bf16 cache pays no dequant), ranking that leaves out incorrect backends, the presets' values and
flags, the one-KV-dtype pair, the CLI's bad input, and the report section."""

from __future__ import annotations

import re

import pytest

from dsv4bench import cli
from dsv4bench.serving import presets as pz
from dsv4bench.serving import recommend
from tests.factories import write_run

ENV = {"arch": "sm90", "gpu": "NVIDIA H100 80GB HBM3"}


def srow(backend, metric, value, *, dequant=0.0, status="ok", x=1, ctx=8192, model="v3.2"):
    ttft = metric == "ttft"
    return {
        "kind": "serving",
        "scenario": "s",
        "case_id": f"{metric}-{model}-{x}-{ctx}",
        "curve_id": f"{metric}-{model}",
        "model": model,
        "metric": metric,
        "backend": backend,
        "route": "sparse-prefill" if ttft else "decode",
        "dequant": "read" if ttft else None,
        "prompt_len": x if ttft else None,
        "chunk_size": ctx if ttft else None,
        "batch_size": None if ttft else x,
        "context_len": None if ttft else ctx,
        "tp": 1,
        "num_heads": 128,
        "value_ms": value if status == "ok" else None,
        "breakdown_ms": {"attention": value - dequant, "dequant": dequant, "remap": 0.0}
        if status == "ok"
        else None,
        "status": status,
        "message": "",
        "parts": [],
        "env": ENV,
    }


def rows():
    out = []
    for x in (4096, 32768):
        k = x / 4096
        out += [
            srow("flashmla", "ttft", 10.0 * k, dequant=1.0 * k, x=x),
            srow("fa3", "ttft", 9.5 * k, dequant=1.0 * k, x=x),
            srow("envelope", "ttft", 9.5 * k, dequant=1.0 * k, x=x),
        ]
    for b in (1, 32):
        out += [
            srow("flashmla", "tpot", 5.0 * b, x=b),
            srow("fa3", "tpot", 4.0 * b, x=b),
            srow("envelope", "tpot", 3.0 * b, x=b),
        ]
    out.append(srow("flashinfer", "tpot", 3.0, x=1))
    out.append(srow("flashinfer", "tpot", 0.0, x=32, status="incorrect"))
    return out


def test_bf16_candidates_pay_no_dequant_and_fp8_ones_do():
    ph = pz.phase(rows(), "v3.2", 1, "ttft")
    v = {c: sum(vals.values()) for c, vals in ph.values.items()}
    assert v[pz.Candidate("flashmla", "sparse-prefill", "fp8")] == pytest.approx(90.0)
    assert v[pz.Candidate("flashmla", "sparse-prefill", "bf16")] == pytest.approx(81.0)
    assert v[pz.Candidate("fa3", "sparse-prefill", "bf16")] == pytest.approx(76.5)
    assert pz.Candidate("fa3", "sparse-prefill", "fp8") not in ph.values  # fa3 reads bf16 only
    assert ph.envelope == {(4096, 8192): 9.5, (32768, 8192): 76.0}


def test_the_envelope_of_a_point_is_its_fastest_row_whichever_comes_last():
    fast, slow = srow("envelope", "ttft", 7.0, x=4096), srow("envelope", "ttft", 9.0, x=4096)
    slow["route"] = "decode-kernel"  # the envelope over the decode route, read after
    for order in ([fast, slow], [slow, fast]):
        assert pz.phase(order, "v3.2", 1, "ttft").envelope == {(4096, 8192): 7.0}


def test_ranking_leaves_out_a_backend_with_an_incorrect_point():
    r = pz.rank(pz.phase(rows(), "v3.2", 1, "tpot"))
    assert [c.backend for c, _ in r.order] == ["fa3", "flashmla"]
    assert r.order[0][1] == pytest.approx(132.0) and r.points == [(1, 8192), (32, 8192)]
    (left,) = r.left_out.items()
    assert left[0].backend == "flashinfer" and left[1] == "incorrect at 1 points"


def test_recommend_names_the_fastest_its_flags_and_each_default():
    text = "\n".join(recommend.lines(rows(), "v3.2", 1))
    assert "TTFT: fastest correct fa3 sparse-prefill (bf16 KV), 76.500 ms" in text
    made = [{**r, "timer": "profiler makespan"} for r in rows()]
    assert "measured (kernel times by profiler makespan)" in recommend.lines(made, "v3.2", 1)[0]
    assert "--attention-backend FLASH_ATTN_MLA_SPARSE" in text
    # sglang H200: flashmla_sparse prefill on a bf16 cache; vLLM's fp8 preset pays the dequant
    assert (
        "sglang-hopper default (sglang 0.5.23: flashmla sparse-prefill (bf16 KV), H100/H200): "
        "81.000 ms" in text
    )
    assert (
        "vllm-hopper-fp8 default (vllm 0.26.0/0.33.0: flashmla sparse-prefill (fp8 KV), "
        "H100/H200): 90.000" in text
    )
    assert (
        "sglang-b200 default (sglang 0.5.23: flashinfer sparse-prefill (fp8 KV)): for B200 "
        "(sm100), not sm90" in text
    )
    assert "not ranked: flashinfer (bf16 KV): incorrect at 1 points" in text
    # flashmla's bf16 sum over fa3's, named as such
    assert "  then flashmla sparse-prefill (bf16 KV): 81.000 ms (x1.06 the fastest's time)" in text
    assert text.endswith("one KV dtype for both phases: bf16 — TTFT fa3 sparse-prefill (bf16 KV), "
                         "TPOT fa3 (bf16 KV)")  # fmt: skip


def _case(backend, status, values=None, heads=64, run="r", case_id=None):
    params = {"model": "v3.2", "num_heads": heads, "tokens": 1024, "values": values}
    name = case_id or f"prefill-{heads}-{values}"
    return {"kind": "case", "case_id": name, "backend": backend, "op": "prefill",
            "status": status, "params": params, "_run": run}  # fmt: skip


def test_a_candidate_incorrect_on_a_case_of_the_runs_is_never_plain_correct():
    """fa3 ran every serving point ok but is incorrect on activation-like values: the fastest
    says where (values, shapes), as does each line naming fa3; a case re-judged ok counts by
    its last row."""
    cases = [
        _case("fa3", "ok"),
        _case("fa3", "incorrect", "outliers", 64),
        _case("fa3", "incorrect", "outliers", 128),
        _case("fa3", "incorrect", case_id="rejudged"),
        _case("fa3", "ok", case_id="rejudged"),
        _case("flashmla", "ok", "outliers"),
    ]
    text = "\n".join(recommend.lines(rows() + cases, "v3.2", 1))
    assert "fastest correct fa3" not in text
    assert (
        "TTFT: fastest fa3 sparse-prefill (bf16 KV) (correct at these points only), 76.500" in text
    )
    where = "incorrect on 2 of 4 fa3 cases of these runs: values outliers at prefill v3.2 h128 " \
        "t1024, prefill v3.2 h64 t1024"  # fmt: skip
    assert f"  {where}\n" in text
    assert f"vllm-hopper default (vllm 0.26.0/0.33.0: fa3 sparse-prefill (bf16 KV), H100/H200): " \
        f"76.500 ms, the fastest [{where}]" in text  # fmt: skip
    assert "then flashmla sparse-prefill (bf16 KV): 81.000 ms (x1.06 the fastest's time)\n" in text
    fine = "\n".join(recommend.lines(rows() + cases[:1] + cases[-1:], "v3.2", 1))
    assert "TTFT: fastest correct fa3 sparse-prefill (bf16 KV), 76.500 ms" in fine


def test_no_rows_for_the_model_is_one_line():
    with pytest.raises(recommend.NothingToRank) as e:
        recommend.lines(rows(), "v4-pro", 1)
    assert str(e.value) == "no serving rows for v4-pro at TP 1 (serving rows: v3.2 TP 1)"


def cand(backend, kv, route="decode"):
    return pz.Candidate(backend, route, kv)


def test_flags_select_the_very_candidate_named():
    """Backend, route and KV dtype: flags keeping an FP8 cache never stand for a bf16-KV
    candidate, and a route no engine takes gets no flags."""
    assert pz.flags_for(cand("triton", "fp8"), "tpot") == (
        "no engine flag selects triton (fp8 KV) (sglang 0.5.23, vllm 0.26.0/0.33.0)"
    )
    assert "--dsa-decode-backend fa3" in pz.flags_for(cand("fa3", "bf16"), "tpot")
    bf16 = pz.flags_for(cand("flashmla", "bf16", "sparse-prefill"), "ttft")
    assert bf16 == (
        "sglang 0.5.23: --dsa-prefill-backend flashmla_sparse --kv-cache-dtype bfloat16"
    )
    fp8 = pz.flags_for(cand("flashmla", "fp8", "sparse-prefill"), "ttft")
    assert "fp8_e4m3" in fp8 and "FLASHMLA_SPARSE --kv-cache-dtype fp8" in fp8
    v4 = pz.flags_for(cand("flashmla", "bf16", "sparse-prefill"), "ttft", "v4-flash")
    assert v4.startswith("no engine flag selects flashmla sparse-prefill (bf16 KV)")
    v4 = pz.flags_for(cand("flashmla", "fp8", "sparse-prefill"), "ttft", "v4-flash")
    # sglang's default is the threshold
    assert v4 == "vllm 0.26.0/0.33.0: defaults (FLASHMLA_SPARSE_DSV4)"
    v4 = pz.flags_for(cand("flashmla", "fp8", "threshold:11673"), "ttft", "v4-flash")
    assert v4 == "sglang 0.5.23: defaults (DSv4 backend)"
    assert "no engine" in pz.flags_for(cand("fa3", "bf16"), "tpot", "v4-flash")
    for f in pz.ENGINE_FLAGS:  # every flag's candidate is one a phase can have
        assert f.kv in pz.kv_options(f.backend, f.route, f.metric), f
    assert all(p.source and p.flags for p in pz.PRESETS)
    assert {p.name for p in pz.presets_for("v3.2", "sm90")} == {
        "sglang-hopper",
        "sglang-hopper-fp8",
        "vllm-hopper",
        "vllm-hopper-fp8",
        "sglang-hopper-q8",
        "vllm-0.34-hopper-fp8",
    }
    # vLLM 0.34.0's small-head call: the instance its scenario defines, with its own flags
    small = pz.flags_for(cand(pz.SMALL_HEADS_034, "fp8", "sparse-prefill"), "ttft")
    assert small == "vllm 0.34.0: --attention-backend FLASHMLA_SPARSE --kv-cache-dtype fp8"


def test_switching_sglang_to_q8kv8_is_an_fp8_prefill_preset():
    q8 = pz.Candidate("q8kv8", "sparse-prefill", "fp8")
    assert pz.flags_for(q8, "ttft") == "sglang 0.5.23: --dsa-prefill-backend flashmla_sparse_q8"
    # V4: sglang casts q per call (cast_q_fp8_for_q8kv8_prefill): the instance that times it
    q8_v4 = pz.Candidate("q8kv8-qcast", "sparse-prefill", "fp8")
    assert "flashmla_sparse_q8" in pz.flags_for(q8_v4, "ttft", "v4-flash")
    assert "no engine flag selects" in pz.flags_for(q8, "ttft", "v4-flash")  # the kernel alone
    assert "no engine flag selects" in pz.flags_for(q8, "tpot")  # a prefill kernel only
    bf16 = pz.Candidate("q8kv8", "sparse-prefill", "bf16")
    assert "no engine flag selects" in pz.flags_for(bf16, "ttft")
    # its per-call gather and e4m3 cast is the dequant part whatever the cache dtype
    assert pz.kv_options("q8kv8", "sparse-prefill", "ttft") == ("fp8",)
    assert pz.kv_options("q8kv8-qcast", "sparse-prefill", "ttft") == ("fp8",)
    (v4,) = [p for p in pz.presets_for("v4-flash", "sm90") if p.prefill == "q8kv8-qcast"]
    assert (v4.name, v4.prefill_route, v4.decode) == ("sglang-hopper-v4-q8", "sparse-prefill",
                                                      "flashmla")  # fmt: skip
    ph = pz.phase([srow("q8kv8", "ttft", 8.0, dequant=1.0)], "v3.2", 1, "ttft")
    assert list(ph.values) == [pz.Candidate("q8kv8", "sparse-prefill", "fp8")]
    assert ph.values[pz.Candidate("q8kv8", "sparse-prefill", "fp8")] == {(1, 8192): 8.0}


def _run_dir(tmp_path):
    return write_run(tmp_path / "run", rows())


def test_the_oracle_is_a_baseline_never_a_candidate():
    oracle = [srow("torch", "tpot", 0.5 * b, x=b) for b in (1, 32)]  # faster than all
    text = "\n".join(recommend.lines(rows() + oracle, "v3.2", 1))
    assert "torch" not in text
    assert "TPOT: fastest correct fa3 (bf16 KV), 132.000 ms" in text


def crashed_rows():
    """The sglang H200 default (flashmla on a bf16 cache) crashes at the long prompt."""
    out = [r for r in rows() if r["backend"] != "flashmla" or r["prompt_len"] != 32768]
    crash = srow("flashmla", "ttft", 0.0, x=32768, status="crash")
    crash["message"] = (
        "ttft-v3.2-32768-8192 on flashmla: crash: worker exited with code 1: CUDA error: "
        "invalid argument (get_decoding_sched_meta.cu)\nTraceback ..."
    )
    return [*out, crash]


def test_a_candidate_that_crashed_is_listed_with_its_points_never_ranked():
    ph = pz.phase(crashed_rows(), "v3.2", 1, "ttft")
    r = pz.rank(ph)
    assert [c.backend for c, _ in r.order] == ["fa3"] and r.points == [(4096, 8192), (32768, 8192)]
    assert r.left_out[cand("flashmla", "bf16", "sparse-prefill")] == "crash at 1 of 2 points"
    text = recommend.lines(crashed_rows(), "v3.2", 1)
    assert "  not ranked: flashmla sparse-prefill (bf16 KV): crash at 1 of 2 points" in text
    i = text.index("  failed, flashmla sparse-prefill (bf16 KV): crash at 1 of 2 points:")
    assert text[i + 1] == (
        "    prompt 32768, chunk 8192: crash: worker exited with code 1: CUDA error: invalid "
        "argument (get_decoding_sched_meta.cu)"
    )
    line = next(t for t in text if t.startswith("  sglang-hopper default"))
    assert "crash at 1 of 2 points (below)" in line and "x" not in line.split("points")[-1]


def test_runs_of_two_gpus_are_refused_whatever_their_order():
    h200 = [{**r, "env": {"arch": "sm90", "gpu": "NVIDIA H200"}} for r in rows()]
    for runs in (rows() + h200, h200 + rows()):
        with pytest.raises(recommend.NothingToRank) as e:
            recommend.lines(runs, "v3.2", 1)
        assert str(e.value) == (
            "serving rows of v3.2 at TP 1 from 2 GPUs (NVIDIA H100 80GB HBM3, NVIDIA H200): "
            "recommend ranks one GPU's runs at a time"
        )


def test_a_point_none_of_whose_parts_ran_names_no_gpu():
    """aggregate writes a point whose parts never ran with no env: it is no second GPU."""
    never_ran = srow("triton", "tpot", 0.0, x=1, status="missing")
    never_ran.pop("env")
    text = recommend.lines([*rows(), never_ran], "v3.2", 1)
    assert text[0] == "v3.2, TP 1, on NVIDIA H100 80GB HBM3 (sm90): " + (
        "sparse-attention part of TTFT/TPOT, measured (kernel times by events)"
    )
    assert "  not ranked: triton (fp8 KV): no ok point (missing at 1 of 2 points)" in text


def test_recommend_command_and_its_bad_input(tmp_path, capsys):
    d = _run_dir(tmp_path)
    assert cli.main(["recommend", str(d), "--model", "v3.2", "--tp", "1"]) == 0
    assert "fastest correct fa3" in capsys.readouterr().out
    assert cli.main(["recommend", str(d), "--model", "v3.2", "--tp", "0"]) == 2
    assert "--tp 0" in capsys.readouterr().err
    assert cli.main(["recommend", str(tmp_path / "none"), "--model", "v3.2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none" in err
    assert cli.main(["recommend", str(d), "--model", "v4-pro", "--tp", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no serving rows for v4-pro at TP 1" in err
    empty = write_run(tmp_path / "empty", [])
    assert cli.main(["recommend", str(empty), "--model", "v3.2", "--tp", "1"]) == 2
    assert "(serving rows: none)" in capsys.readouterr().err
    h200 = write_run(
        tmp_path / "h200", [{**r, "env": {**ENV, "gpu": "NVIDIA H200"}} for r in rows()]
    )
    assert cli.main(["recommend", str(d), str(h200), "--model", "v3.2", "--tp", "1"]) == 2
    assert "from 2 GPUs" in capsys.readouterr().err
    # two runs of one GPU: a ranking never pairs rows of two runs, whatever their order
    again = write_run(tmp_path / "again", rows())
    for order in ([d, again], [again, d]):
        args = ["recommend", *map(str, order), "--model", "v3.2", "--tp", "1"]
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "from 2 runs" in err and "one run directory" in err


def test_nothing_to_rank_when_every_candidate_of_every_phase_failed(tmp_path, capsys):
    failed = [
        srow(b, m, 0.0, x=x, status=s)
        for b, s in (("flashmla", "crash"), ("fa3", "incorrect"))
        for m in ("ttft", "tpot")
        for x in (1, 32)
    ]
    d = write_run(tmp_path / "failed", failed)
    assert cli.main(["recommend", str(d), "--model", "v3.2"]) == 2
    out, err = capsys.readouterr()
    assert err == (
        "dsv4bench: nothing to rank for v3.2 at TP 1: no correct candidate in TTFT or TPOT "
        "(each was incorrect at a point or ran none ok; listed above)\n"
    )
    assert "  failed, flashmla (fp8 KV): crash at 2 of 2 points:" in out.splitlines()
    assert "TPOT: no correct backend" in out
    # one phase with a correct candidate is something to rank
    tpot_ok = [r for r in failed if r["metric"] == "ttft"] + rows()[6:12]
    assert (
        cli.main(["recommend", str(write_run(tmp_path / "half", tpot_ok)), "--model", "v3.2"]) == 0
    )
    out = capsys.readouterr().out
    assert "TTFT: no correct backend" in out and "TPOT: fastest correct fa3 (bf16 KV)" in out


def test_the_report_pairs_preset_rows_within_one_run(tmp_path):
    from dsv4bench.report import build_report

    slow = [{**r, "value_ms": r["value_ms"] * 10} if r.get("value_ms") else r for r in rows()]
    runs = [_run_dir(tmp_path), write_run(tmp_path / "slow", slow)]
    build_report(runs, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.count("### v3.2, TP 1, run ") == 2
    # each run's own ratio: the x10 run's sglang default is as far from its own fastest
    assert md.count("| sglang-hopper | sglang 0.5.23 | H100/H200 | bf16 | flashmla sparse-prefill "
                    "(bf16 KV) |") == 2  # fmt: skip
    assert md.count(" | 1.06x |") >= 2


def test_every_preset_names_the_file_and_engine_version_it_was_read_from():
    for p in pz.PRESETS:
        assert p.versions and all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in p.versions), p.name
        assert re.search(r"[\w/]+\.(py|md)\b", p.source), f"{p.name}: source names no file"
        assert p.engine in ("sglang", "vllm") and p.engine_label().startswith(p.engine), p.name
    for f in pz.ENGINE_FLAGS:  # flags are of an engine version too
        assert re.fullmatch(r"(sglang|vllm) \d+\.\d+\.\d+(/\d+\.\d+\.\d+)*", f.engine), f


def test_report_has_the_presets_section(tmp_path):
    from dsv4bench.report import build_report

    files = build_report([_run_dir(tmp_path)], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Engine presets against the envelope" in md and "### v3.2, TP 1" in md
    assert (
        "| sglang-hopper | sglang 0.5.23 | H100/H200 | bf16 | flashmla sparse-prefill (bf16 KV) "
        "| 81 | 1.06x |" in md
    )
    assert any(f.name.startswith("presets-tpot-v3") for f in files)


def test_the_report_says_where_its_fastest_candidate_is_incorrect(tmp_path):
    from dsv4bench.report import build_report

    cases = [_case("fa3", "ok"), _case("fa3", "incorrect", "outliers")]
    for c in cases:
        c.pop("_run")
    run = write_run(tmp_path / "run", [*rows(), *cases])
    build_report([run], tmp_path / "out")
    md = " ".join((tmp_path / "out" / "report.md").read_text().split())
    assert (
        "The fastest TTFT candidate, fa3 sparse-prefill (bf16 KV), is correct at these points "
        "only: incorrect on 1 of 2 fa3 cases of these runs: values outliers at prefill v3.2 "
        "h64 t1024." in md
    )


def test_kv_options_are_the_backends_own_declarations():
    from dsv4bench import backends
    from dsv4bench.backends.base import Backend

    class Casting(Backend):
        name = "dsv4-test-casting"
        cast_every_call = True

    backends.register(Casting())
    try:
        assert pz.kv_options("dsv4-test-casting", "sparse-prefill", "ttft") == ("fp8",)
    finally:
        backends._REGISTRY.pop("dsv4-test-casting")
    assert pz.kv_options("flashinfer", "sparse-prefill", "ttft") == ("bf16",)
    assert pz.kv_options("flashinfer-e4m3", "sparse-prefill", "ttft") == ("bf16", "fp8")
    assert pz.kv_options("flashmla", "sparse-prefill", "ttft") == ("bf16", "fp8")
