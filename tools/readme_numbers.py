"""The figures the READMEs and docs cite, recomputed from the committed rows.

A cited figure is marked in its markdown file as `<!-- n:NAME -->VALUE<!-- /n -->`; FIGURES
says how NAME is computed (with the report's own code, so a figure reads as the report does).
`--check` (CI, `.ci/run`) fails with one line per figure whose text no longer matches its
rows, and on a marker of an unknown name; `--write` puts the recomputed values in. In the
findings and every results README a measured figure left unmarked must be dated: its paragraph
or section heading names its run (a tree commit, a date or the run's folder; dated_prose.py).

    python3 tools/readme_numbers.py --check
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsv4bench.report.load import is_probe, load_rows, load_runs  # noqa: E402
from dsv4bench.report.sections import winners  # noqa: E402
from dsv4bench.report.sections.workloads import ragged_ratios  # noqa: E402
from dsv4bench.rows import timers  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import dated_prose  # noqa: E402

# the files whose marked figures are checked: these, and every study's README.md
CITING = (
    "README.md",
    "docs/findings.md",
    "results/sm90/studies/workloads/COMMANDS.md",
    "results/sm90/studies/engine-kernels/COMMANDS.md",
)
STUDY_READMES = sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / "results").rglob("README.md")
    if p.relative_to(ROOT).parts[1] != "ci"  # .ci/run's own output
)
FILES = (*CITING, *STUDY_READMES)
MARK = re.compile(r"<!-- n:([a-z0-9_]+) -->(.*?)<!-- /n -->", re.S)

WORKLOADS = "results/sm90/studies/workloads"
BASELINE = "results/sm90/baseline-h100"
FA3_RUNS = (
    "results/sm90/studies/engine-kernels/compare",
    "results/sm90/studies/engine-kernels/flashinfer-fa3",
)


@cache
def rows(path: str) -> list[dict]:
    return load_rows(ROOT / path)


def span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def workload_rows() -> str:
    return str(len(rows(WORKLOADS)))


def ragged_ratio_range() -> str:
    """ragged time / uniform time over every ragged case row with a uniform twin."""
    return span([ratio for _, ratio in ragged_ratios(rows(WORKLOADS))])


def ragged_ratio_max_at() -> str:
    row, _ = max(ragged_ratios(rows(WORKLOADS)), key=lambda t: t[1])
    p = row["params"]
    return f"{row['backend']}, {p['model']} C{p['compress_ratio']} {p['op']}"


def _fa3_ratios(op: str) -> list[float]:
    """fa3 time / FlashMLA time on V4 at 64 and 128 heads, per run (the winners' rule)."""
    shapes = winners.shapes(load_runs([ROOT / p for p in FA3_RUNS]))
    return [
        s.ratio("fa3")
        for s in shapes
        if s.params.get("op") == op
        and str(s.params.get("model")).startswith("v4")
        and s.params.get("num_heads") in (64, 128)
        and s.ratio("fa3")
    ]


def fa3_v4_decode_ratio() -> str:
    return span(_fa3_ratios("decode"))


def fa3_v4_prefill_ratio() -> str:
    return span(_fa3_ratios("prefill"))


def baseline_case_rows() -> str:
    return str(sum(r.get("kind") == "case" for r in rows(BASELINE)))


def baseline_limit_rows() -> str:
    return str(sum(r.get("kind") == "limit" for r in rows(BASELINE)))


def baseline_jobs() -> str:
    """Case jobs the run made (limit probes are the limit searches' own)."""
    return str(sum(r.get("kind") == "case" and not is_probe(r) for r in rows(BASELINE)))


def baseline_wall_s() -> str:
    """The command's wall time in seconds: the sum of bench.log's `wall_s=` lines (one per
    invocation of a run resumed across GPU calls)."""
    text = (ROOT / BASELINE / "bench.log").read_text()
    pieces = [int(s) for s in re.findall(r"^rc=\d+ wall_s=(\d+)$", text, re.M)]
    return str(sum(pieces)) if pieces else "?"


def baseline_ok_by_backend() -> str:
    ok = Counter(r["backend"] for r in rows(BASELINE) if r.get("status") == "ok")
    return ", ".join(f"{b} {n} ok" for b, n in sorted(ok.items(), key=lambda t: (-t[1], t[0])))


STUDIES = "results/sm90/studies"


def _last_rows(path: str) -> list[dict]:
    """A run's case rows, the later row of a (case, backend) job winning (a resumed run)."""
    last = {(r["case_id"], r["backend"]): r for r in rows(path) if r.get("kind") == "case"}
    return list(last.values())


def _pair_ratios(path: str, a: str, b: str, where=None, **params) -> list[float]:
    """a's time / b's time per case both ran ok, by the first timer both rows measured; only
    rows with these params and, given `where`, for which where(row) holds."""
    by: dict[str, dict[str, dict]] = {}
    for r in _last_rows(path):
        if (
            r.get("status") == "ok"
            and all(r["params"].get(k) == v for k, v in params.items())
            and (where is None or where(r))
        ):
            by.setdefault(r["case_id"], {})[r["backend"]] = r
    out = []
    for pair in by.values():
        if a in pair and b in pair:
            key, _ = timers.shared([pair[a], pair[b]])
            out.append(timers.value(pair[a], key) / timers.value(pair[b], key))
    return out


def _shape_ratios(build: str, tag: str | None = None, heads=(1, 10**9), run=None) -> list[float]:
    """FlashMLA `build`'s time / the own Triton kernels' on the triton-shapes cases tagged
    `tag` (None: all) with num_heads in [heads[0], heads[1]] (> 1: ours faster), in `run`
    (default the H100's)."""

    def where(r: dict) -> bool:
        tagged = tag is None or tag in r["tags"]
        return tagged and heads[0] <= r["params"]["num_heads"] <= heads[1]

    return _pair_ratios(run or SHAPES, build, "triton", where)


def _shape_figures() -> dict[str, Callable[[], str]]:
    """shapes_<class>_{span,median}[_26]: the triton-shapes classes against FlashMLA from
    vLLM 0.33.0 (and _26: 0.26.0)."""
    classes = {"fewq": ("few-query", (1, 10**9)), "mtp64": ("mtp", (64, 64)),
               "mtp128": ("mtp", (128, 128)), "batch": ("batch", (64, 128)),
               "prefill": ("prefill", (64, 128)), "tp": ("tp", (1, 32))}  # fmt: skip
    out: dict[str, Callable[[], str]] = {}
    runs = (("", "flashmla-vllm-0.33.0", SHAPES), ("_26", "flashmla-vllm-0.26.0", SHAPES),
            ("_h200", "flashmla-vllm-0.33.0", SHAPES_H200))  # fmt: skip
    for name, (tag, heads) in classes.items():
        for suffix, build, run in runs:
            ratios = lambda tag=tag, heads=heads, build=build, run=run: _shape_ratios(
                build, tag, heads, run
            )
            out[f"shapes_{name}_span{suffix}"] = lambda r=ratios: span(r())
            out[f"shapes_{name}_median{suffix}"] = lambda r=ratios: _median(r())
    return out


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}"


def _span3(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.2f}"


TOPK = f"{STUDIES}/topk/run"  # tree 6b04eac: FlashInfer 0.7.2.post1's rows, no torch-topk
TOPK_TT = f"{STUDIES}/topk/run-1c68753"  # torch.topk as engines call it beside the others
SGLTRI = f"{STUDIES}/sglang-triton/compare"
VLLM = f"{STUDIES}/vllm-bench/mla-sparse-decode"
SPIN = f"{STUDIES}/sglang-triton/spin-check"
SHAPES = f"{STUDIES}/triton-shapes/run"
SHAPES_H200 = f"{STUDIES}/triton-shapes/run-h200"


def _gap_rows(path: str) -> str:
    """Rows whose profiler makespan is over 1.2x their busy time (a host gap between kernels)."""
    timed = [r for r in _last_rows(path) if timers.value(r, "profiler_busy_ms")]
    gapped = [
        r
        for r in timed
        if timers.value(r, "profiler_ms") > 1.2 * timers.value(r, "profiler_busy_ms")
    ]
    return f"{len(gapped)} of {len(timed)}"


def _serving_points(*runs: str, where=lambda r: True) -> list[dict]:
    """The ok serving rows of the topk study's serving runs for which where(row) holds."""
    return [
        r
        for run in runs
        for r in rows(f"{STUDIES}/topk/{run}")
        if r.get("kind") == "serving" and r.get("status") == "ok" and where(r)
    ]


def _percent_span(values: list[float]) -> str:
    return f"{100 * min(values):.0f}-{100 * max(values):.0f}"


def _serving_split(run: str, metric: str, part: str, whole: str) -> str:
    """breakdown_ms[part] / breakdown_ms[whole] over a serving run's points of `metric`: in %
    of the indexer, else (a kernel's time against the indexer's own top-k) as a ratio."""
    values = [
        r["breakdown_ms"][part] / r["breakdown_ms"][whole]
        for r in _serving_points(run, where=lambda r: r.get("metric") == metric)
    ]
    return _percent_span(values) if whole == "indexer" else span(values)


def _topk_pairs(a: str, b: str, run: str = TOPK) -> list[tuple[dict, dict]]:
    """(a's row, b's row) of each case both ran ok in the top-k run `run`."""
    by: dict[str, dict[str, dict]] = {}
    for r in _last_rows(run):
        if r["status"] == "ok":
            by.setdefault(r["case_id"], {})[r["backend"]] = r
    return [(p[a], p[b]) for p in by.values() if a in p and b in p]


def _topk_rows_of(a: str, b: str, run: str = TOPK) -> str:
    """'N of M': the cases a and b both ran ok, of a's ok rows."""
    ok = sum(r["status"] == "ok" and r["backend"] == a for r in _last_rows(run))
    return f"{len(_topk_pairs(a, b, run))} of {ok}"


def _topk_ok_of(backend: str, run: str) -> str:
    """'N of M': a backend's ok rows of all its rows in a top-k run."""
    got = [r["status"] for r in _last_rows(run) if r["backend"] == backend]
    return f"{got.count('ok')} of {len(got)}"


def _topk_timer_flips(a: str, b: str) -> str:
    """'N of M': pairs whose faster side differs between the shared timer and the events
    median."""
    pairs = _topk_pairs(a, b)
    flips = 0
    for x, y in pairs:
        key, _ = timers.shared([x, y])
        by_shared = timers.value(x, key) < timers.value(y, key)
        flips += by_shared != (timers.events_ms(x) < timers.events_ms(y))
    return f"{flips} of {len(pairs)}"


def _topk_graph_eager(backend: str) -> str:
    """A backend's CUDA-graph replay / its own events median, over its ok top-k rows."""
    got = [
        timers.value(r, "graph_ms") / timers.events_ms(r)
        for r in _last_rows(TOPK)
        if r["backend"] == backend and r["status"] == "ok" and timers.value(r, "graph_ms")
    ]
    return span(got)


def _indexer_share_batch1() -> str:
    """indexer / the point's total at TPOT batch 1, both serving runs, in %."""
    batch1 = _serving_points(
        "serving", "serving-v32", where=lambda r: r["metric"] == "tpot" and r["batch_size"] == 1
    )
    return _percent_span([r["breakdown_ms"]["indexer"] / r["value_ms"] for r in batch1])


def _topk_incorrect(backend: str, run: str = TOPK) -> str:
    return str(sum(r["status"] == "incorrect" and r["backend"] == backend for r in _last_rows(run)))


def _failures_statuses() -> str:
    n = Counter(r["status"] for r in _last_rows(f"{STUDIES}/failures/shapes"))
    return ", ".join(f"{k} {n[k]}" for k in ("ok", "incorrect", "error", "crash", "unsupported"))


def _limit_161k() -> str:
    """'N of M': the context-limit searches that probed the engine issue's 161K (164864) and
    found it ok, of those that probed it."""
    last = {
        (r["case_id"], r["backend"]): r
        for r in rows(f"{STUDIES}/failures/context-limits")
        if r.get("kind") == "limit"
    }
    probed = [r["probes"]["164864"] for r in last.values() if "164864" in (r.get("probes") or {})]
    return f"{probed.count('ok')} of {len(probed)}"


def _envelope(status: str) -> str:
    """Cells of the committed sm90 envelope (dsv4bench envelope's envelope.jsonl, committed
    gzipped) of a status."""
    import gzip
    import json

    path = ROOT / "results/envelope/sm90-h100/envelope.jsonl.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    cells = [json.loads(line) for line in text.splitlines() if line.strip()]
    return str(len(cells) if status == "all" else sum(c["status"] == status for c in cells))


DSA = f"{STUDIES}/dsa-helpers/run"
DSA_NEW = f"{STUDIES}/dsa-helpers/run-5fe1f86"


def _dsa_statuses(run: str = DSA) -> str:
    n = Counter(r["status"] for r in _last_rows(run))
    return ", ".join(f"{n[k]} {k}" for k in ("ok", "incorrect", "error", "unsupported"))


def _dsa_span(a: str, op: str, b: str = "triton", run: str = DSA) -> str:
    """a's time / b's on the dsa-helpers cases of `op` both ran ok (n pairs)."""
    r = _pair_ratios(run, a, b, op=op)
    return f"{span(r)} ({len(r)} cases)" if len(r) > 1 else f"{r[0]:.2f} (1 case)"


def _dsa_same_verdicts(backend: str) -> str:
    """Jobs of `backend` in both dsa-helpers runs whose status and differing bytes/values agree,
    of those in both (the pruned _C of DSA_NEW against the unpruned one of DSA)."""
    old = {(r["case_id"], r["backend"]): r for r in _last_rows(DSA)}

    def verdict(r):
        acc = r.get("accuracy") or {}
        return r["status"], acc.get("bytes_differ"), acc.get("mismatched")

    both = [(old[k], r) for r in _last_rows(DSA_NEW) if (k := (r["case_id"], r["backend"])) in old]
    both = [(o, n) for o, n in both if n["backend"] == backend]
    return f"{sum(verdict(o) == verdict(n) for o, n in both)} of {len(both)}"


def _dsa_cache_differ(backend: str) -> str:
    """Differing bytes / bytes of the records written, per incorrect cache_write row."""
    out = []
    for r in _last_rows(DSA):
        if r["backend"] == backend and r["op"] == "cache_write" and r["status"] == "incorrect":
            p = r["params"]
            written = p["batch_size"] * p["s_q"] * 656  # V3.2's 656-byte record per token
            out.append(f"{r['accuracy']['bytes_differ']} of {written}")
    return ", ".join(sorted(out))


def _status_count(status: str) -> str:
    return str(sum(r.get("kind") == "case" and r.get("status") == status for r in rows(BASELINE)))


Q8_PREFILL = f"{STUDIES}/q8kv8/prefill"
Q8_SERVING = f"{STUDIES}/q8kv8/serving"


def _q8_cases() -> str:
    """q8kv8's cases in the prefill study (a re-judged case by its last row)."""
    n = Counter(r["status"] for r in _last_rows(Q8_PREFILL) if r["backend"] == "q8kv8")
    return f"{sum(n.values())} cases: {n['ok']} ok, {n['incorrect']} incorrect"


def _q8_against(other: str) -> str:
    """other's time / q8kv8's per case both ran ok (the first timer both measured):
    span, geometric mean, cases."""
    r = _pair_ratios(Q8_PREFILL, other, "q8kv8")
    mean = math.exp(sum(math.log(x) for x in r) / len(r))
    return f"{min(r):.2f}..{max(r):.2f}x (geometric mean {mean:.2f}, {len(r)} cases)"


def _q8_claim_shape() -> str:
    """FlashMLA / q8kv8 at the authors' shape (V3.2, 4096 tokens, 128 heads, top-2048) on
    normal values, per context the study ran it at."""
    shape = dict(model="v3.2", tokens=4096, num_heads=128, topk=2048, values=None)
    by: dict[int, dict[str, dict]] = {}
    for r in _last_rows(Q8_PREFILL):
        if r["status"] == "ok" and all(r["params"].get(k) == v for k, v in shape.items()):
            by.setdefault(r["params"]["context_len"], {})[r["backend"]] = r
    out = []
    for context, pair in sorted(by.items()):
        key, _ = timers.shared([pair["flashmla"], pair["q8kv8"]])
        a, b = (timers.value(pair[x], key) for x in ("flashmla", "q8kv8"))
        out.append(f"{a:.3f} against {b:.3f} ms ({a / b:.2f}x) at context {context}")
    return ", ".join(out)


def _q8_error(key: str, values: str | None) -> str:
    """The span of accuracy[key] over q8kv8's cases on `values` (None: the normal ones)."""
    got = [
        r["accuracy"][key]
        for r in _last_rows(Q8_PREFILL)
        if r["backend"] == "q8kv8" and r["params"].get("values") == values
    ]
    form = ".2g" if min(got) > 1e-3 else ".1e"
    return f"{min(got):{form}}..{max(got):{form}}"


def _q8_ttft(model: str) -> dict:
    """Per candidate label, its TTFT per point of the q8kv8 serving run (serving/presets.py's
    phase: a bf16-cache candidate pays no dequant)."""
    from dsv4bench.serving import presets as pz

    ph = pz.phase(rows(Q8_SERVING), model, 1, "ttft")
    return {c.label(): v for c, v in ph.values.items()}


def _q8_v32_ttft_gain() -> str:
    """sglang's bf16 default (FlashMLA sparse prefill, bf16 KV) / the q8 preset, summed over
    the points both ran."""
    v = _q8_ttft("v3.2")
    q8, bf16 = v["q8kv8 sparse-prefill (fp8 KV)"], v["flashmla sparse-prefill (bf16 KV)"]
    both = [p for p in q8 if p in bf16]
    return f"{sum(bf16[p] for p in both) / sum(q8[p] for p in both):.2f}x over {len(both)} points"


def _q8_ttft_at(model: str, q8: str, other: str, point: tuple) -> str:
    v = _q8_ttft(model)
    return f"{v[q8][point]:.1f} against {v[other][point]:.1f} ms"


def _q8_v4_slower() -> str:
    """Points where q8kv8 with its q cast is slower than FlashMLA (fp8 KV), of those it ran."""
    v = _q8_ttft("v4-flash")
    q8, fm = v["q8kv8-qcast sparse-prefill (fp8 KV)"], v["flashmla sparse-prefill (fp8 KV)"]
    both = [p for p in q8 if p in fm]
    return f"{sum(q8[p] > fm[p] for p in both)} of the {len(both)}"


FIGURES: dict[str, Callable[[], str]] = {
    "q8_cases": _q8_cases,
    "q8_flashmla": lambda: _q8_against("flashmla"),
    "q8_fa3": lambda: _q8_against("fa3"),
    "q8_triton": lambda: _q8_against("triton"),
    "q8_claim_shape": _q8_claim_shape,
    "q8_cos_bf16": lambda: _q8_error("cos_diff", None),
    "q8_cos_exact": lambda: _q8_error("exact_cos_diff", None),
    "q8_cos_outliers": lambda: _q8_error("cos_diff", "outliers"),
    "q8_v32_ttft_gain": _q8_v32_ttft_gain,
    "q8_v32_ttft_4k": lambda: _q8_ttft_at(
        "v3.2", "q8kv8 sparse-prefill (fp8 KV)", "flashmla sparse-prefill (bf16 KV)", (4096, 4096)
    ),
    "q8_v4_slower": _q8_v4_slower,
    "q8_v4_ttft_4k": lambda: _q8_ttft_at(
        "v4-flash",
        "q8kv8-qcast sparse-prefill (fp8 KV)",
        "flashmla sparse-prefill (fp8 KV)",
        (4096, 4096),
    ),  # fmt: skip
    "dsa_statuses": _dsa_statuses,
    "dsa_vllm_dequant": lambda: _dsa_span("vllm-ops-0.33.0", "dequant"),
    "dsa_sglang_dequant": lambda: _dsa_span("sglang-ops-0.5.23", "dequant"),
    "dsa_vllm_topk": lambda: _dsa_span("vllm-ops-0.33.0", "topk"),
    "dsa_persistent_topk": lambda: _dsa_span("vllm-persistent-topk", "topk"),
    "dsa_cooperative_topk": lambda: _dsa_span("vllm-cooperative-topk", "topk"),
    "dsa_vllm_remap": lambda: _dsa_span("vllm-triton-0.33.0", "remap"),
    "dsa_sglang_remap": lambda: _dsa_span("sglang-ops-0.5.23", "remap"),
    "dsa_sglang_page_split": lambda: _dsa_span("sglang-ops-0.5.23", "page_split"),
    "dsa_cache_differ": lambda: _dsa_cache_differ("vllm-ops-0.33.0"),
    "dsa_new_statuses": lambda: _dsa_statuses(DSA_NEW),
    "dsa_pruned_same": lambda: _dsa_same_verdicts("vllm-ops-0.33.0"),
    "dsa_v4_gather": lambda: _dsa_span("vllm-v4-cache-0.33.0", "dequant", run=DSA_NEW),
    "dsa_v41_gather": lambda: _dsa_span("vllm-v41-cache-0.33.0", "dequant", run=DSA_NEW),
    "dsa_one_pass_gather": lambda: _dsa_span("vllm-v41-cache-one-pass-0.33.0", "dequant", run=DSA_NEW),
    "workload_rows": workload_rows,
    "ragged_ratio_range": ragged_ratio_range,
    "ragged_ratio_max_at": ragged_ratio_max_at,
    "fa3_v4_decode_ratio": fa3_v4_decode_ratio,
    "fa3_v4_prefill_ratio": fa3_v4_prefill_ratio,
    "baseline_case_rows": baseline_case_rows,
    "baseline_limit_rows": baseline_limit_rows,
    "baseline_jobs": baseline_jobs,
    "baseline_wall_s": baseline_wall_s,
    "baseline_ok_by_backend": baseline_ok_by_backend,
    "baseline_unsupported": lambda: _status_count("unsupported"),
    "baseline_crash": lambda: _status_count("crash"),
    "topk_sglang_triton_span": lambda: _span3(_pair_ratios(TOPK, "sglang-topk", "triton")),
    "topk_sglang_triton_median": lambda: _median(_pair_ratios(TOPK, "sglang-topk", "triton")),
    "topk_sglang_incorrect": lambda: _topk_incorrect("sglang-topk"),
    "topk_flashinfer_incorrect": lambda: _topk_incorrect("flashinfer"),
    "topk_flashinfer_triton_median": lambda: _median(_pair_ratios(TOPK, "flashinfer", "triton")),
    "topk_flashinfer_sglang_span": lambda: _span3(_pair_ratios(TOPK, "flashinfer", "sglang-topk")),
    "topk_flashinfer_sglang_median": lambda: _median(
        _pair_ratios(TOPK, "flashinfer", "sglang-topk")
    ),
    # x torch.topk: both sides rows of run-1c68753, the first timer both hold (graph replay)
    "topk_tt_rows": lambda: _topk_ok_of("torch-topk", TOPK_TT),
    "topk_oracle_tt_span": lambda: span(_pair_ratios(TOPK_TT, "torch", "torch-topk")),
    "topk_triton_tt_rows": lambda: _topk_rows_of("torch-topk", "triton", TOPK_TT),
    "topk_triton_tt_span": lambda: span(_pair_ratios(TOPK_TT, "triton", "torch-topk")),
    "topk_triton_tt_median": lambda: _median(_pair_ratios(TOPK_TT, "triton", "torch-topk")),
    "topk_sglang_tt_rows": lambda: _topk_rows_of("torch-topk", "sglang-topk", TOPK_TT),
    "topk_sglang_tt_span": lambda: span(_pair_ratios(TOPK_TT, "sglang-topk", "torch-topk")),
    "topk_sglang_tt_median": lambda: _median(_pair_ratios(TOPK_TT, "sglang-topk", "torch-topk")),
    "topk_sglang_incorrect_tt": lambda: _topk_incorrect("sglang-topk", TOPK_TT),
    # the indexer's own top-k (its call less its logits alone) / the indexer's call, in %
    "topk_share_ttft": lambda: _serving_split("serving", "ttft", "indexer_topk", "indexer"),
    "topk_share_tpot": lambda: _serving_split("serving", "tpot", "indexer_topk", "indexer"),
    "topk_share_ttft_v32": lambda: _serving_split("serving-v32", "ttft", "indexer_topk", "indexer"),
    "topk_share_tpot_v32": lambda: _serving_split("serving-v32", "tpot", "indexer_topk", "indexer"),
    # the fastest top-k kernel alone on the same rows / the indexer's own top-k
    "topk_alone_ratio": lambda: _serving_split("serving", "tpot", "topk_alone", "indexer_topk"),
    "topk_fi_sgl_flips": lambda: _topk_timer_flips("flashinfer", "sglang-topk"),
    "topk_fi_graph_eager": lambda: _topk_graph_eager("flashinfer"),
    "topk_indexer_share_b1": _indexer_share_batch1,
    "topk_alone_ratio_v32": lambda: _serving_split(
        "serving-v32", "tpot", "topk_alone", "indexer_topk"
    ),
    "sgltri_sm120_median": lambda: (
        f"{statistics.median(_pair_ratios(SGLTRI, 'sglang-triton', 'triton')):.0f}"
    ),
    "sgltri_fused_span": lambda: span(_pair_ratios(SGLTRI, "sglang-triton-fused", "triton")),
    "sgltri_fused_median": lambda: _median(_pair_ratios(SGLTRI, "sglang-triton-fused", "triton")),
    "sgltri_dsa_decode_median": lambda: _median(
        _pair_ratios(SGLTRI, "sglang-triton-dsa", "triton")
    ),
    "sgltri_dsa_prefill_median": lambda: _median(
        _pair_ratios(SGLTRI, "sglang-triton-dsa-prefill", "triton")
    ),
    "sgltri_sm120_span": lambda: "{:.0f}-{:.0f}".format(
        min(_pair_ratios(SGLTRI, "sglang-triton", "triton")),
        max(_pair_ratios(SGLTRI, "sglang-triton", "triton")),
    ),
    "sgltri_triton_flashmla_span": lambda: span(_pair_ratios(SGLTRI, "triton", "flashmla")),
    "sgltri_triton_flashmla_median": lambda: _median(_pair_ratios(SGLTRI, "triton", "flashmla")),
    "sgltri_dsa_decode_span": lambda: span(_pair_ratios(SGLTRI, "sglang-triton-dsa", "triton")),
    "sgltri_dsa_prefill_span": lambda: span(
        _pair_ratios(SGLTRI, "sglang-triton-dsa-prefill", "triton")
    ),
    "vllm_fi_fm_span": lambda: span(_pair_ratios(VLLM, "flashinfer", "flashmla")),
    "vllm_fi_fm_median": lambda: _median(_pair_ratios(VLLM, "flashinfer", "flashmla")),
    "failures_statuses": _failures_statuses,
    "limit_161k": _limit_161k,
    "spin_triton_flashmla_span": lambda: span(_pair_ratios(SPIN, "triton", "flashmla")),
    "spin_gap_rows": lambda: _gap_rows(SPIN),
    "baseline_gap_rows": lambda: _gap_rows(BASELINE),
    "envelope_cells": lambda: _envelope("all"),
    "envelope_ok": lambda: _envelope("ok"),
    "envelope_unsupported": lambda: _envelope("unsupported"),
    "envelope_incorrect": lambda: _envelope("incorrect"),
    "envelope_refused": lambda: _envelope("refused"),
    "envelope_crash": lambda: _envelope("crash"),
    "envelope_planned": lambda: _envelope("planned"),
    "shapes_rows": lambda: str(sum(r["status"] == "ok" for r in _last_rows(SHAPES))),
    "shapes_rows_h200": lambda: str(sum(r["status"] == "ok" for r in _last_rows(SHAPES_H200))),
    "shapes_below_08_h200": lambda: str(
        sum(r < 0.8 for r in _shape_ratios("flashmla-vllm-0.33.0", run=SHAPES_H200))
    ),
    "shapes_below_08": lambda: str(sum(r < 0.8 for r in _shape_ratios("flashmla-vllm-0.33.0"))),
    "shapes_tp_at_least_1": lambda: "{} of {}".format(
        sum(r >= 1 for r in _shape_ratios("flashmla-vllm-0.33.0", "tp", (1, 32))),
        len(_shape_ratios("flashmla-vllm-0.33.0", "tp", (1, 32))),
    ),
    **_shape_figures(),
}


BUILDS = f"{STUDIES}/builds"


def _ratio_text(r: list[float]) -> str:
    """span, geometric mean and case count of per-case time ratios of one run."""
    mean = math.exp(sum(math.log(x) for x in r) / len(r))
    return f"{min(r):.2f}..{max(r):.2f}x (geometric mean {mean:.3f}, {len(r)} cases)"


def _statuses(run: str, backend_prefix: str = "") -> str:
    n = Counter(r["status"] for r in _last_rows(f"{BUILDS}/{run}")
                if r["backend"].startswith(backend_prefix))  # fmt: skip
    return ", ".join(f"{n[k]} {k}" for k in sorted(n, key=lambda k: (-n[k], k)))


def _preset_ttft() -> str:
    """vLLM 0.34.0's preset (unpadded small-head prefill) TTFT / the padded call's, per prompt."""
    got: dict[int, dict[str, float]] = {}
    for r in rows(f"{BUILDS}/presets-vllm034"):
        if r.get("kind") == "serving" and r.get("status") == "ok" and r["metric"] == "ttft":
            got.setdefault(r["prompt_len"], {})[r["backend"]] = r["value_ms"]
    return ", ".join(f"{n}: {d['flashmla-small-heads'] / d['flashmla']:.2f}"
                     for n, d in sorted(got.items()))  # fmt: skip


RELEASE_FIGURES: dict[str, Callable[[], str]] = {
    "rel_flashmla_034": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/releases-attn", "flashmla-vllm-0.34.0", "flashmla-vllm-0.33.0")),
    "rel_fa3_034": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/releases-attn", "fa3-vllm-0.34.0", "fa3-vllm-0.33.0")),
    "rel_attn_statuses": lambda: _statuses("releases-attn"),
    "rel_fi_statuses": lambda: _statuses("releases-flashinfer"),
    "topk_fi074_statuses": lambda: _statuses("topk-flashinfer-0.7.4"),
    "dg_statuses": lambda: _statuses("deepgemm-next-n"),
    "dg_034_033": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/deepgemm-next-n", "dg-vllm-0.34.0", "dg-vllm-0.33.0")),
    "dg_026_033": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/deepgemm-next-n", "dg-vllm-0.26.0", "dg-vllm-0.33.0")),
    "preset_ttft_034": _preset_ttft,
}  # fmt: skip
FIGURES.update(RELEASE_FIGURES)

# the files whose every measured figure is marked or dated: the findings and the study READMEs
DATED = ("docs/findings.md", *STUDY_READMES)


def undated(root: Path = ROOT, files=DATED) -> list[str]:
    """One line per paragraph holding a measured figure that is neither marked (and so
    recomputed) nor dated to its run (tools/dated_prose.py)."""
    return dated_prose.undated(root, files, MARK)


def problems(root: Path = ROOT, files=FILES, figures=FIGURES) -> list[str]:
    """One line per marked figure whose text differs from its recomputed value."""
    found = []
    for name in files:
        text = (root / name).read_text()
        for m in MARK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            key, cited = m.group(1), m.group(2)
            if key not in figures:
                found.append(f"{name}:{line}: unknown figure {key!r}")
                continue
            value = figures[key]()
            if cited != value:
                found.append(f"{name}:{line}: {key} reads {cited!r}, the rows say {value!r}")
    return found


def write(root: Path = ROOT, files=FILES, figures=FIGURES) -> int:
    """Put every marked figure's recomputed value in; returns how many changed."""
    changed = 0
    for name in files:
        path = root / name
        text = path.read_text()

        def fill(m: re.Match) -> str:
            nonlocal changed
            key = m.group(1)
            value = figures[key]() if key in figures else m.group(2)
            changed += value != m.group(2)
            return f"<!-- n:{key} -->{value}<!-- /n -->"

        path.write_text(MARK.sub(fill, text))
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 on a stale figure")
    mode.add_argument("--write", action="store_true", help="put the recomputed values in")
    args = ap.parse_args(argv)
    if args.write:
        print(f"{write()} figures changed")
        return 0
    found = problems() + undated()
    print("\n".join(found) if found else "README numbers: every marked figure matches its rows")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
