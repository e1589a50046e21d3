"""What serving engines run for sparse MLA by default, per GPU, and what measured serving rows say
about it: each preset's TTFT/TPOT from the backends it runs, the fastest correct backend per
phase, and the engine flags that select each backend.

A preset names a suite backend per phase and the KV-cache dtype the engine keeps:
  TTFT  the preset's prefill backend on its route (serving rows of that backend and route);
  TPOT  its decode backend (one decode step per layer).
KV dtype: the serving model's sparse-prefill route adds the FP8 -> bf16 dequant an FP8-cache
engine pays; an engine with a bf16 cache reads it as is, so a bf16 candidate's TTFT is the row's
value minus its dequant part. Backends that read only a bf16 cache (fa3, FlashInfer's bf16
path) are bf16 candidates only; FlashMLA's and Triton's decode kernels and the decode routes
read the FP8 cache. One engine keeps one KV dtype for both phases: `best_pair` picks the fastest
TTFT + TPOT pair that shares one.

Sources (file and version; docs/kernel-facts.md, Engine presets): see each preset's `source`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsv4bench import backends as registry
from dsv4bench.backends.base import Backend
from dsv4bench.rows import ORACLE_BACKENDS
from dsv4bench.scenarios.serving_spec import DECODE_ROUTES
from dsv4bench.serving.aggregate import ENVELOPE

# V4's q8kv8 as sglang runs it: the kernel with its per-call q cast timed in (an instance of
# q8kv8 with time_q_cast, defined by scenarios/serving/presets_q8kv8_v4_flash_sm90.yaml and
# scenarios/compare/q8kv8_sm90.yaml)
Q8KV8_V4 = "q8kv8-qcast"
# the instances the presets name that no registry holds, by the backend each is built from
PRESET_INSTANCES = {Q8KV8_V4: "q8kv8"}
ENGINE_KV_DTYPES = ("bf16", "fp8")  # the cache dtypes an engine keeps


@dataclass(frozen=True)
class Preset:
    name: str
    engine: str  # sglang | vllm
    versions: tuple[str, ...]  # the engine versions whose code `source` was read from
    gpu: str  # what the engine's defaults are for
    arch: str
    models: tuple[str, ...]
    kv: str  # bf16 | fp8
    prefill: str  # suite backend of TTFT
    prefill_route: str  # serving route of its TTFT rows
    decode: str  # suite backend of TPOT
    flags: str
    source: str  # the file (and function) the default was read from
    note: str = ""

    def engine_label(self) -> str:
        """`sglang 0.5.23`, `vllm 0.26.0/0.33.0`: whose default this is."""
        return f"{self.engine} {'/'.join(self.versions)}"


# sglang 0.5.23 resolves the DSA (V3.2, GLM-5) backends in srt/arg_groups/overrides.py:
# _dsa_kv_cache_dtype_default makes `--kv-cache-dtype auto` bfloat16 below sm100 (fp8_e4m3 from
# sm100 on, models without learnable sinks), _dsa_split_backend_resolution then picks
# fp8_e4m3: flashmla_kv (Hopper) / trtllm (Blackwell) for both phases; bfloat16: flashmla_sparse
# prefill, fa3 (Hopper) / trtllm (Blackwell) decode. The flags are `--dsa-*` (formerly `--nsa-*`).
SGLANG_DSA = (
    "sglang 0.5.23 srt/arg_groups/overrides.py (_dsa_kv_cache_dtype_default, "
    "_dsa_split_backend_resolution)"
)
SGLANG_Q8_SOURCE = (
    "sglang 0.5.23 srt/layers/attention/dsa_backend.py (_validate_flashmla_sparse_q8_backend, "
    "_forward_flashmla_sparse_q8kv8; sglang PRs 25751, 30514, 32327)"
)
# vLLM picks the first backend of _get_backend_priorities (vllm/platforms/cuda.py) that takes the
# layer's head size and KV dtype: on sm90 FLASH_ATTN_MLA_SPARSE (bf16 caches only),
# FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE_SM90, except that 0.33.0 puts FlashInfer first for head
# size 512 (NoPE: GLM-5.3-Flash). Unchanged for head size 576 from 0.26.0 (then in
# vllm/v1/attention/selector.py) to 0.33.0.
VLLM_SM90 = "vllm/platforms/cuda.py _get_backend_priorities (sm90 sparse tail)"
DSA = ("v3.2", "glm-5.2")  # the DSA models (576-wide rows) whose defaults these are
# FlashMLA as vLLM 0.34.0 calls its Hopper prefill (option small_heads=vllm-0.34.0, an instance
# the serving scenario defines)
SMALL_HEADS_034 = "flashmla-small-heads"
VLLM_034_SMALL_HEADS = (
    "vllm 0.34.0 vllm/v1/attention/backends/mla/flashmla_sparse.py "
    "(_should_use_bf16_small_head_kernel, _bf16_flash_mla_kernel)"
)
PRESETS: tuple[Preset, ...] = (
    Preset(
        "sglang-hopper",
        "sglang",
        ("0.5.23",),
        "H100/H200",
        "sm90",
        DSA,
        "bf16",
        "flashmla",
        "sparse-prefill",
        "fa3",
        "defaults (kv-cache-dtype auto = bfloat16 on sm90): --dsa-prefill-backend "
        "flashmla_sparse --dsa-decode-backend fa3",
        SGLANG_DSA,
        "prefills of <= 2048 tokens run FA3 varlen MHA (dense, on decompressed K/V), which the "
        "suite does not time: their TTFT here is the sparse path's",
    ),
    Preset(
        "sglang-hopper-fp8",
        "sglang",
        ("0.5.23",),
        "H100/H200",
        "sm90",
        DSA,
        "fp8",
        "flashmla",
        "decode-kernel",
        "flashmla",
        "--kv-cache-dtype fp8_e4m3 (then --dsa-prefill-backend flashmla_kv "
        "--dsa-decode-backend flashmla_kv)",
        f"{SGLANG_DSA}; srt/layers/attention/dsa_backend.py _forward_flashmla_kv "
        "(q viewed (T, 1, h, d): the decode kernel with b = T)",
    ),
    Preset(
        "sglang-b200",
        "sglang",
        ("0.5.23",),
        "B200",
        "sm100",
        DSA,
        "fp8",
        "flashinfer",
        "sparse-prefill",
        "flashinfer",
        "defaults (kv-cache-dtype auto = fp8_e4m3 on sm100): --dsa-prefill-backend trtllm "
        "--dsa-decode-backend trtllm",
        f"{SGLANG_DSA}; srt/layers/attention/dsa_backend.py _forward_trtllm (FlashInfer's "
        "trtllm-gen sparse MLA)",
        "earlier sglang (docs/basic_usage/deepseek_v32.md, mid-2026) defaulted to flashmla_auto "
        "/ flashmla_kv here",
    ),
    Preset(
        "vllm-hopper",
        "vllm",
        ("0.26.0", "0.33.0"),
        "H100/H200",
        "sm90",
        DSA,
        "bf16",
        "fa3",
        "sparse-prefill",
        "fa3",
        "defaults (kv-cache-dtype auto = bf16): FLASH_ATTN_MLA_SPARSE "
        "(--attention-backend FLASH_ATTN_MLA_SPARSE)",
        f"{VLLM_SM90}; vllm/v1/attention/backends/mla/flashattn_mla_sparse.py",
    ),
    Preset(
        "vllm-hopper-fp8",
        "vllm",
        ("0.26.0", "0.33.0"),
        "H100/H200",
        "sm90",
        DSA,
        "fp8",
        "flashmla",
        "sparse-prefill",
        "flashmla",
        "--kv-cache-dtype fp8 (fp8_ds_mla: FLASHMLA_SPARSE is the first sparse backend that "
        "takes it)",
        f"{VLLM_SM90}; vllm/v1/attention/backends/mla/flashmla_sparse.py",
        "below 32 heads per rank vLLM runs prefill through the FP8 decode kernel as one mixed "
        "batch (route decode-mixed)",
    ),
    # vLLM 0.34.0: the same FlashMLA binary, called unpadded at 8/16/32 heads above the SM
    # count (x 2 at 32): scenarios/serving/presets_vllm034_v32_sm90.yaml times both calls
    Preset(
        "vllm-0.34-hopper-fp8",
        "vllm",
        ("0.34.0",),
        "H100/H200",
        "sm90",
        DSA,
        "fp8",
        SMALL_HEADS_034,
        "sparse-prefill",
        "flashmla",
        "--kv-cache-dtype fp8 (FLASHMLA_SPARSE)",
        f"{VLLM_SM90}; {VLLM_034_SMALL_HEADS}",
        "32 heads per rank (V3.2 TP4): prefill calls of more than 2 x SMs tokens run unpadded, "
        "smaller ones padded to 64; below 32 heads the fp8 cache takes the mixed batch "
        "(decode-mixed) as in 0.33.0. Not V4/V4.1: vllm/models/deepseek_v4/nvidia/flashmla.py "
        "still pads to 64",
    ),
    Preset(
        "vllm-hopper-nope",
        "vllm",
        ("0.33.0",),
        "H100/H200",
        "sm90",
        ("glm-5.3-flash",),
        "bf16",
        "flashinfer",
        "sparse-prefill",
        "flashinfer",
        "defaults for head size 512: FLASHINFER_MLA_SPARSE_SM90",
        f"{VLLM_SM90}; vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py",
        "vLLM issue 56564: this default arrived with FlashInfer 0.6.18 support",
    ),
    Preset(
        "vllm-hopper-v4",
        "vllm",
        ("0.26.0", "0.33.0"),
        "H100/H200",
        "sm90",
        ("v4-flash", "v4-pro"),
        "fp8",
        "flashmla",
        "sparse-prefill",
        "flashmla",
        "defaults: FLASHMLA_SPARSE_DSV4 (model-driven)",
        "vllm/models/deepseek_v4/attention.py (FLASHMLA_SPARSE_DSV4 on CUDA), "
        "vllm/models/deepseek_v4/sparse_mla.py DeepseekV4FlashMLABackend",
    ),
    Preset(
        "sglang-hopper-v4",
        "sglang",
        ("0.5.23",),
        "H100/H200",
        "sm90",
        ("v4-flash", "v4-pro"),
        "fp8",
        "flashmla",
        "threshold:11673",
        "flashmla",
        "defaults (DSv4 backend)",
        "sglang 0.5.23 srt/layers/attention/deepseek_v4_backend.py _use_sparse_prefill "
        "(chunks of > _LARGE_INDEXER_QUERY_THRESHOLD = 11673 tokens, dsv4/metadata.py, to "
        "flash_mla_sparse_fwd; the rest through the decode kernel; sglang #25502)",
    ),
    # What switching sglang's sparse prefill to the FP8 x FP8 kernel saves (docs/kernel-facts.md,
    # Q8KV8): decode unchanged, prefill through q8kv8 on the sparse-prefill route.
    Preset(
        "sglang-hopper-q8",
        "sglang",
        ("0.5.23",),
        "H100/H200",
        "sm90",
        DSA,
        "fp8",
        "q8kv8",
        "sparse-prefill",
        "flashmla",
        "--dsa-prefill-backend flashmla_sparse_q8 --dsa-decode-backend flashmla_kv "
        "--kv-cache-dtype fp8_e4m3",
        SGLANG_Q8_SOURCE,
        "q and the gathered KV are cast to e4m3 per call (identity scales); the KV gather is "
        "the dequant part. sglang also accepts a bf16 cache here, which it casts the same way",
    ),
    Preset(
        "sglang-hopper-v4-q8",
        "sglang",
        ("0.5.23",),
        "H100/H200",
        "sm90",
        ("v4-flash", "v4-pro"),
        "fp8",
        Q8KV8_V4,
        "sparse-prefill",
        "flashmla",
        "--dsv4-prefill-backend flashmla_sparse_q8 (or SGLANG_DSV4_Q8KV8_PREFILL=1)",
        "sglang 0.5.23 srt/layers/attention/deepseek_v4_backend.py "
        "_forward_prefill_sparse_q8kv8; dsv4/sparse_prefill_utils.py "
        "use_dsv4_q8kv8_sparse_prefill; srt/arg_groups/fields/exec_.py dsv4_prefill_backend",
        "sglang sends only the chunks its sparse-prefill rule picks (> 11673 tokens) to Q8KV8, "
        "the rest to the decode kernel; modelled as every chunk on sparse-prefill. Timed with "
        "the per-call q cast (cast_q_fp8_for_q8kv8_prefill)",
    ),
)


@dataclass(frozen=True)
class EngineFlags:
    """Flags that make one engine run one candidate: a backend on a route with a KV dtype."""

    family: str  # the models: "v3.2" (DSA: V3.2, GLM-5) or "v4" (V4-Flash, V4-Pro)
    backend: str
    engine: str  # sglang | vllm, with the versions whose flags these are
    metric: str  # ttft | tpot
    route: str  # the serving route of its TTFT rows; "decode" for TPOT
    kv: str  # the KV-cache dtype the flags keep
    flags: str


def _both(family, backend, engine, prefill_route, kv, ttft, tpot=None) -> tuple[EngineFlags, ...]:
    return (
        EngineFlags(family, backend, engine, "ttft", prefill_route, kv, ttft),
        EngineFlags(family, backend, engine, "tpot", "decode", kv, tpot or ttft),
    )


SP = "sparse-prefill"
SGL = "sglang 0.5.23"  # srt/arg_groups/fields/exec_.py: --dsa-* (earlier releases: --nsa-*)
VLLM = "vllm 0.26.0/0.33.0"
ENGINE_FLAGS: tuple[EngineFlags, ...] = (
    *_both("v3.2", "fa3", SGL, SP, "bf16", "--dsa-prefill-backend fa3 --kv-cache-dtype bfloat16",
           "--dsa-decode-backend fa3 --kv-cache-dtype bfloat16"),
    *_both("v3.2", "fa3", VLLM, SP, "bf16", "--attention-backend FLASH_ATTN_MLA_SPARSE"),
    EngineFlags("v3.2", "flashmla", SGL, "ttft", SP, "bf16",
                "--dsa-prefill-backend flashmla_sparse --kv-cache-dtype bfloat16"),
    *_both("v3.2", "flashmla", SGL, SP, "fp8",
           "--dsa-prefill-backend flashmla_sparse --kv-cache-dtype fp8_e4m3",
           "--dsa-decode-backend flashmla_kv --kv-cache-dtype fp8_e4m3"),
    EngineFlags("v3.2", "flashmla", SGL, "ttft", "decode-kernel", "fp8",
                "--dsa-prefill-backend flashmla_kv --kv-cache-dtype fp8_e4m3"),
    *_both("v3.2", "flashmla", VLLM, SP, "fp8",
           "--attention-backend FLASHMLA_SPARSE --kv-cache-dtype fp8"),
    EngineFlags("v3.2", SMALL_HEADS_034, "vllm 0.34.0", "ttft", SP, "fp8",
                "--attention-backend FLASHMLA_SPARSE --kv-cache-dtype fp8"),
    *_both("v3.2", "flashinfer", VLLM, SP, "bf16",
           "--attention-backend FLASHINFER_MLA_SPARSE_SM90"),
    *_both("v3.2", "flashinfer-e4m3", VLLM, SP, "fp8",
           "--attention-backend FLASHINFER_MLA_SPARSE_SM90 --kv-cache-dtype fp8"),
    # sglang's FP8 x FP8 sparse prefill (docs/kernel-facts.md, Q8KV8): prefill only
    EngineFlags("v3.2", "q8kv8", SGL, "ttft", SP, "fp8",
                "--dsa-prefill-backend flashmla_sparse_q8"),
    # V4 backends are chosen by the model in both engines: FlashMLA is their Hopper default
    *_both("v4", "flashmla", SGL, "threshold:11673", "fp8", "defaults (DSv4 backend)"),
    *_both("v4", "flashmla", VLLM, SP, "fp8", "defaults (FLASHMLA_SPARSE_DSV4)"),
    EngineFlags("v4", Q8KV8_V4, SGL, "ttft", SP, "fp8",
                "--dsv4-prefill-backend flashmla_sparse_q8 (or SGLANG_DSV4_Q8KV8_PREFILL=1)"),
)  # fmt: skip


def flags_for(cand: Candidate, metric: str, model: str = "") -> str:
    """`engine version: flags` for every engine whose flags run this very candidate (backend,
    route and KV dtype) in this phase, or a line saying that no engine flag does."""
    family = "v4" if model.startswith("v4") else "v3.2"
    found = [
        f"{f.engine}: {f.flags}"
        for f in ENGINE_FLAGS
        if (f.family, f.backend, f.metric, f.route, f.kv)
        == (family, cand.backend, metric, cand.route, cand.kv)
    ]
    return "; ".join(found) or f"no engine flag selects {cand.label()} ({SGL}, {VLLM})"


# ---- candidates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One way to run a phase: a backend on a route with a KV dtype."""

    backend: str
    route: str
    kv: str

    def label(self) -> str:
        route = "" if self.route in ("decode", "") else f" {self.route}"
        return f"{self.backend}{route} ({self.kv} KV)"


@dataclass
class Phase:
    """Every candidate's value per point of one phase (metric) of one model and TP."""

    metric: str
    points: list[tuple] = field(default_factory=list)  # point keys, in order
    values: dict[Candidate, dict[tuple, float]] = field(default_factory=dict)
    # point -> (status, message) of every point a candidate did not run ok
    failed: dict[Candidate, dict[tuple, tuple[str, str]]] = field(default_factory=dict)
    envelope: dict[tuple, float] = field(default_factory=dict)


def point_key(row: dict) -> tuple:
    if row.get("metric") == "ttft":
        return (row.get("prompt_len"), row.get("chunk_size"))
    return (row.get("batch_size"), row.get("context_len"))


def engine_backend(name: str) -> Backend | None:
    """The backend a serving row names (an instance the presets name: its base), for the
    facts it declares (Backend.bf16_kv, Backend.cast_every_call); None if unknown."""
    try:
        return registry.get(PRESET_INSTANCES.get(name, name))
    except KeyError:
        return None


def kv_options(backend: str, route: str, metric: str) -> tuple[str, ...]:
    """The KV dtypes an engine keeping the cache in them could run `backend` with: a bf16
    cache only for kernels that read bf16 only; FP8 only for a prefill that casts the cache on
    every call anyway (the dequant op writes bf16: an upper bound on its e4m3 write), for the
    decode routes and whatever is not the sparse prefill; else both."""
    declared = engine_backend(backend)
    if declared is not None and declared.bf16_kv:
        return ("bf16",)
    if declared is not None and declared.cast_every_call:
        return ("fp8",)
    if metric == "tpot" or route in DECODE_ROUTES or route != "sparse-prefill":
        return ("fp8",)
    return ENGINE_KV_DTYPES


def _route(row: dict) -> str:
    if row.get("metric") == "tpot":
        return "decode"
    route = row.get("route") or ""
    dequant = row.get("dequant")
    return route + (f" dequant={dequant}" if dequant not in (None, "read") else "")


def phase(rows: list[dict], model: str, tp: int, metric: str) -> Phase:
    """The serving rows of one model, TP and metric as candidates' values per point."""
    ph = Phase(metric)
    for r in rows:
        if r.get("kind") != "serving" or r.get("model") != model or r.get("metric") != metric:
            continue
        if (r.get("tp") or 1) != tp:
            continue
        key = point_key(r)
        if key not in ph.points:
            ph.points.append(key)
        route = _route(r)
        if r["backend"] in ORACLE_BACKENDS:  # a baseline, never a candidate
            continue
        if r["backend"] == ENVELOPE:
            if r.get("status") == "ok" and route.startswith(("sparse-prefill", "decode")):
                ph.envelope[key] = min(ph.envelope.get(key, float("inf")), r["value_ms"])
            continue
        for kv in kv_options(r["backend"], route.split(" ")[0], metric):
            cand = Candidate(r["backend"], route, kv)
            if r.get("status") != "ok" or r.get("value_ms") is None:
                status = r.get("status") or "missing"
                ph.failed.setdefault(cand, {})[key] = (status, r.get("message") or "")
                continue
            dequant = (r.get("breakdown_ms") or {}).get("dequant") or 0.0
            value = r["value_ms"] - (dequant if kv == "bf16" else 0.0)
            ph.values.setdefault(cand, {})[key] = value
    ph.points.sort(key=lambda k: tuple(x or 0 for x in k))
    return ph


@dataclass
class Ranking:
    points: list[tuple]  # the points every ranked candidate ran ok
    order: list[tuple[Candidate, float]]  # (candidate, sum over points), fastest first
    left_out: dict[Candidate, str]  # candidates not ranked, and why


def failures(ph: Phase, cand: Candidate) -> str:
    """'crash at 2 of 6 points' (statuses counted), or '' for a candidate that failed none."""
    bad = [status for status, _ in ph.failed.get(cand, {}).values()]
    counts = ", ".join(f"{s} at {bad.count(s)}" for s in sorted(set(bad)))
    return f"{counts} of {len(ph.points)} points" if bad else ""


def rank(ph: Phase, kv: str | None = None) -> Ranking:
    """Candidates ranked by their sum over the points all of them ran ok. Never ranked: a
    candidate with an `incorrect` point (not correct), one with no ok point, and, while some
    candidate ran every point it has a row for, one that failed (crashed, ...) at a point."""
    left_out: dict[Candidate, str] = {}
    ok: dict[Candidate, dict] = {}
    for cand in set(ph.values) | set(ph.failed):
        if kv and cand.kv != kv:
            continue
        bad = [status for status, _ in ph.failed.get(cand, {}).values()]
        if "incorrect" in bad:
            left_out[cand] = f"incorrect at {bad.count('incorrect')} points"
        elif not ph.values.get(cand):
            left_out[cand] = f"no ok point ({failures(ph, cand)})"
        else:
            ok[cand] = ph.values[cand]
    if any(c not in ph.failed for c in ok):  # a crash is no speed: rank those that ran
        for cand in [c for c in ok if c in ph.failed]:
            ok.pop(cand)
            left_out[cand] = failures(ph, cand)
    if not ok:
        return Ranking([], [], left_out)
    common = [p for p in ph.points if all(p in v for v in ok.values())]
    if not common:  # rank on each candidate's own points, the widest first
        widest = max(len(v) for v in ok.values())
        for cand in [c for c, v in ok.items() if len(v) < widest]:
            left_out[cand] = f"ok at {len(ok.pop(cand))} of {widest} points"
        common = [p for p in ph.points if all(p in v for v in ok.values())]
    order = sorted(((c, sum(v[p] for p in common)) for c, v in ok.items()), key=lambda t: t[1])
    return Ranking(common, order, left_out)


def preset_candidate(p: Preset, metric: str) -> Candidate:
    if metric == "ttft":
        return Candidate(p.prefill, p.prefill_route, p.kv)
    return Candidate(p.decode, "decode", p.kv)


def presets_for(model: str, arch: str | None = None) -> list[Preset]:
    return [p for p in PRESETS if model in p.models and (arch is None or p.arch == arch)]


def value_on(ph: Phase, cand: Candidate, points: list[tuple]) -> float | None:
    v = ph.values.get(cand, {})
    return sum(v[p] for p in points) if points and all(p in v for p in points) else None
