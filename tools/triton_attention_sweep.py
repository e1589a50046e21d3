"""Launch-shape sweep of the Triton attention kernel against FlashMLA on cases of
scenarios/sm90/triton_vs_flashmla.yaml, and of the Triton ragged indexer against DeepGEMM's
fp8_mqa_logits (logits only, no top-k), on a GPU; times with dsv4bench.measure.timing, cold L2.

    python3 tools/triton_attention_sweep.py [--jobs N] [--no-indexer] [--no-attention]
                                            [CASE_PREFIX ...]
(FlashMLA from $DSV4BENCH_FLASHMLA_LIB, deep_gemm importable: tools/gpu/setup.sh.)

First compiles every (case, config) in its own process, N at a time (Triton's on-disk cache
keeps the kernels; a compile that fails or aborts is reported and its config left out), then
times them one by one in this process. Prints one line per (case, config):
median ms and the ratio of the engine's time to it (> 1: Triton is faster).
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SCENARIO = "scenarios/sm90/triton_vs_flashmla.yaml"
DEFAULT_CASES = [
    "decode-v3.2-v32-h128-b64-",
    "decode-v3.2-v32-h128-b128-",
    "decode-v4-pro-v4-h128-b64-",
    "decode-v4-flash-v4-h64-b128-",
    "decode-v4-flash-v4-h64-b64-",
    "decode-v4-flash-v4-h32-b64-",
    "decode-v3.2-v32-h16-b64-",
    "decode-v3.2-v32-h32-b64-",
    "prefill-v4-flash-v4-h64-t4096-",
    "prefill-v3.2-v32-h128-t4096-",
    "prefill-v4-flash-v4-h32-t4096-",
    "prefill-v3.2-v32-h16-t4096-",
]
# (block_h, block_n, num_warps, num_stages, idx_ahead); the shipped default first. The
# loop-pipelining
# variants of sweep1.txt (tl.range(num_stages=2..4), 16/32-key blocks) were removed with the
# kernel's LOOP_STAGES/PREFETCH options after they lost everywhere.
# (..., gluon, chunk, producer_regs): the Gluon producer/consumer kernel
GLUON = [(64, 64, 8, 1, True, True, 64, 120), (64, 64, 8, 1, False, True, 32, 96),
         (64, 64, 8, 1, True, True, 32, 96)]  # fmt: skip
GLUON_BF16 = [(64, 64, 8, 1, False, True, 64, 56), (64, 64, 8, 1, False, True, 16, 96),
              (64, 64, 8, 1, True, True, 64, 56, False, False, True),
              (64, 64, 8, 1, True, True, 16, 96, False, False, True)]  # fmt: skip
# (..., narrow): the Gluon kernel with 16/32 heads as the wgmma's N (keys as M)
NARROW_GLUON_FP8 = [(16, 64, 8, 1, False, True, 32, 96, True),
                    (16, 64, 8, 1, True, True, 64, 120, True)]  # fmt: skip
NARROW_GLUON_BF16 = [(32, 64, 8, 1, True, True, 64, 56, True),
                     (32, 64, 8, 1, True, True, 16, 96, True)]  # fmt: skip
WIDE_FP8 = [(64, 64, 8, 1, True), (64, 64, 8, 2, True), *GLUON]  # idx_ahead: indices early
NARROW_FP8 = [(64, 64, 8, 1, False, True, 64, 120), *NARROW_GLUON_FP8]
WIDE_BF16 = [(64, 64, 8, 2, True), *GLUON_BF16]
# (32-key blocks, 1 or 3 stages lost in sweep-g8 of results/sm90/triton-gluon-h100)
NARROW_BF16 = [(32, 64, 4, 2, True), *NARROW_GLUON_BF16]
# ragged indexer: overrides of the shipped launch (triton.indexer.ragged_launcher's tiles)
INDEXER_TILES = [
    None,
    dict(BLOCK_N=256, num_warps=4),
    dict(BLOCK_N=256, num_warps=4, STAGES=2),
    dict(BLOCK_N=256, num_warps=4, STAGES=4),
    dict(BLOCK_N=256, num_warps=4, BLOCK_Q=128),
    dict(BLOCK_N=256, num_warps=4, BLOCK_Q=32),
    dict(BLOCK_N=256, num_warps=4, BLOCK_Q=128, STAGES=4),
]
INDEXER_CASES = [
    "v4-flash:4096:32768",
    "v4-flash:4096:131072",
    "v3.2:4096:32768",
    "v4-flash:4096:8192",
]
# paged indexer (decode): model:batch:s_q:context_len, timed with both dot orientations
PAGED_CASES = ["v4-flash:64:1:65536", "v4-flash:128:1:8192", "v3.2:64:2:65536"]


def _alternate(heads: int, layout: str, d_qk: int):
    """The narrow Gluon kernel with its consumer warpgroups on alternate key blocks (and, on
    bf16 rows, the copies completing the buffer's barrier), sized for `heads`."""
    bh = 16 if heads <= 16 else 32
    if layout == "bf16":
        return [(bh, 64, 8, 1, True, True, 64, 56, True, True, True),
                (bh, 64, 8, 1, True, True, 64, 56, True, True, False),
                (bh, 64, 8, 1, True, True, 64, 48, True, True, True),
                (bh, 64, 8, 1, True, True, 16, 96, True, True, True),
                (bh, 64, 8, 1, True, True, 64, 56, True, False, True)]  # fmt: skip
    ahead = layout == "v4"
    chunks = [(64, 120), (32, 96)] if layout == "v32" else [(32, 96)]
    return [(bh, 64, 8, 1, ahead, True, c, r, True, True) for c, r in chunks]


def _configs(heads: int, layout: str, d_qk: int):
    """(Config, splits or None = the planner's) pairs; the first is the shipped default."""
    from dsv4bench.backends.triton.tuning import Config, config_for

    if layout == "bf16":
        table = WIDE_BF16 if heads >= 64 else NARROW_BF16
    else:
        table = WIDE_FP8 if heads >= 64 else NARROW_FP8
    if heads < 64:
        table = table + _alternate(heads, layout, d_qk)
    default = config_for(heads, layout, True, d_qk)
    old = config_for(heads, layout)  # the Triton kernel's shape
    rest = [c for c in [old] + [Config(*x) for x in table] if c != default]
    return [(default, None)] + [(c, None) for c in dict.fromkeys(rest)]


def _layout(case) -> str:
    from dsv4bench.backends.triton.attention import uses_decode_kernel

    return case.layout if uses_decode_kernel(case) else "bf16"


def _cases(prefixes):
    from dsv4bench import backends
    from dsv4bench.scenarios import load

    scenario = load(SCENARIO, known_backends=backends.names())
    return [next(c for c in scenario.cases if c.case_id.startswith(p)) for p in prefixes]


def _launch(case, x, cfg, splits=None):
    from dsv4bench.backends.triton import attention as ta

    decode = ta.uses_decode_kernel(case)
    extra = {}
    if decode:
        extra = {"extra_kv": x.get("extra_k_cache"), "extra_indices": x.get("extra_indices"),
                 "extra_topk_length": x.get("extra_topk_length")}  # fmt: skip
    return ta.plan_attention(
        x["q"],
        x["k_cache"] if decode else x["kv"],
        x["indices"],
        case.scale,
        layout=case.layout if decode else "bf16",
        op="decode" if decode else "prefill",
        topk_length=x.get("topk_length"),
        attn_sink=x.get("attn_sink"),
        config=cfg,
        splits=splits,
        **extra,
    )


def _compile(args):
    prefix, index = args
    import torch

    from dsv4bench.cases import inputs

    case = _cases([prefix])[0]
    x = inputs.make_inputs(case, "cuda")
    cfg, splits = _configs(case.num_heads, _layout(case), case.d_qk)[index]
    try:
        _launch(case, x, cfg, splits).run()
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # a shape that does not compile or fit: reported, not fatal
        return f"{case.case_id} {cfg}: {type(e).__name__}: {str(e)[:200]}"


def _compile_apart(job) -> str:
    """_compile in a process of its own: a compiler that aborts (an LLVM assertion) is one
    failed config, not a hung pool."""
    prefix, index = job
    r = subprocess.run([sys.executable, __file__, "--compile-one", prefix, str(index)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode == 0:
        return ""
    tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or ["no output"]
    return f"{prefix} config {index}: exit {r.returncode}: {tail[0][:200]}"


def _attention(prefixes, kw, broken=frozenset()) -> None:
    import torch

    from dsv4bench import backends
    from dsv4bench.cases import inputs
    from dsv4bench.measure import metrics, timing

    fm = backends.get("flashmla")
    for case in _cases(prefixes):
        x = inputs.make_inputs(case, "cuda")
        ref_ms = None
        try:
            ref_ms = timing.measure(fm.prepare(case, x, "cuda").run, **kw)["median_ms"]
            print(f"{case.case_id:58s} flashmla {ref_ms:8.4f} ms", flush=True)
        except Exception as e:
            print(f"{case.case_id:58s} flashmla failed: {type(e).__name__}: {e}", flush=True)
        want = None  # the shipped default's output: every variant is compared with it
        configs = _configs(case.num_heads, _layout(case), case.d_qk)
        for index, (cfg, splits) in enumerate(configs):
            if (_prefix_of(case, prefixes), index) in broken:
                continue  # its compile failed (reported above); compiling here would too
            try:
                launch = _launch(case, x, cfg, splits)
                ms = timing.measure(launch.run, **kw)["median_ms"]
                got = _as_output(case, x, launch.run())
                got = type(got)(got.out.clone(), got.lse.clone())
                if want is None:
                    want = got
                cos = metrics.accuracy(want, got).get("cos_diff")
            except Exception as e:
                print(f"{'':58s} {cfg}: failed {type(e).__name__}: {str(e)[:150]}", flush=True)
                continue
            ratio = f"{ref_ms / ms:6.3f}x" if ref_ms else "-"
            print(f"{'':58s} bh{cfg.block_h} bn{cfg.block_n} w{cfg.num_warps} "
                  f"s{cfg.num_stages} ia{int(cfg.idx_ahead)} "
                  f"{f'gluon c{cfg.chunk} r{cfg.producer_regs} ' if cfg.gluon else ''}"
                  f"{'narrow ' if cfg.narrow else ''}{'alt ' if cfg.alternate else ''}"
                  f"{'async ' if cfg.async_fill else ''}"
                  f"splits{launch.info['splits']} {ms:8.4f} ms  flashmla/triton {ratio} "
                  f"cos {cos:.2g}", flush=True)  # fmt: skip
        del x
        torch.cuda.empty_cache()


def _prefix_of(case, prefixes) -> str:
    return next(p for p in prefixes if case.case_id.startswith(p))


def _as_output(case, x, got):
    from dsv4bench.backends.triton import attention as ta
    from dsv4bench.cases.output import Output, prefill_output

    out, lse, _ = got
    if ta.uses_decode_kernel(case):
        b, s_q, h, _ = x["q"].shape
        o = out.view(b, s_q, h, ta.D_V)
        return prefill_output(o, lse) if case.op == "prefill" else Output(o, lse)
    return Output(out, lse)


def _indexer(kw) -> None:
    import torch

    from dsv4bench.backends.triton import indexer as ti
    from dsv4bench.cases import inputs
    from dsv4bench.cases.case import Case
    from dsv4bench.measure import timing

    try:
        import deep_gemm
    except Exception as e:
        deep_gemm = None
        print("deep_gemm:", type(e).__name__, e)
    for spec in INDEXER_CASES:
        model, tokens, ctx = spec.split(":")
        case = _indexer_case(Case, model, int(tokens), int(ctx))
        x = inputs.make_inputs(case, "cuda")
        kv = (x["kv"], x["kv_scales"])
        ref_ms, want = None, None
        if deep_gemm is not None:
            fn = functools.partial(
                deep_gemm.fp8_mqa_logits, x["q"], kv, x["weights"], x["ks"], x["ke"]
            )
            try:
                want = fn()
                ref_ms = timing.measure(fn, **kw)["median_ms"]
                print(f"indexer {spec:28s} deepgemm {ref_ms:8.4f} ms", flush=True)
            except Exception as e:
                print(f"indexer {spec:28s} deepgemm failed {type(e).__name__}: {e}", flush=True)
        for tiles in INDEXER_TILES:
            t = tiles
            try:
                launch, out = ti.ragged_launcher(x["q"], kv, x["weights"], x["ks"], x["ke"],
                                                 tiles=t)  # fmt: skip
                launch()
                ms = timing.measure(launch, **kw)["median_ms"]
                err = "-"
                if want is not None:
                    fin = torch.isfinite(want)
                    same_inf = bool((fin == torch.isfinite(out)).all())
                    rel = ((out[fin] - want[fin]).norm() / want[fin].norm()).item()
                    err = f"rel {rel:.2g} inf-match {same_inf}"
            except Exception as e:
                print(f"{'':36s} {tiles}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            ratio = f"{ref_ms / ms:6.3f}x" if ref_ms else "-"
            print(f"{'':36s} {str(tiles):24s} {ms:8.4f} ms deepgemm/triton {ratio} {err}",
                  flush=True)  # fmt: skip
        del x
        torch.cuda.empty_cache()


def _indexer_case(Case, model, tokens, ctx, batch=0, s_q=1):
    from dsv4bench import backends
    from dsv4bench.scenarios import load

    scenario = load("scenarios/indexer/sm90.yaml", known_backends=backends.names())
    for c in scenario.cases:
        same = c.model == model and c.tokens == tokens and c.context_len == ctx
        if same and (tokens or (c.batch_size == batch and c.s_q == s_q)):
            return c
    raise SystemExit(f"no indexer case {model} {tokens} {ctx} {batch} {s_q}")


def _paged(kw) -> None:
    """The paged (decode) logits with heads as the dot's M and with keys as M."""
    import torch

    from dsv4bench.backends.triton import indexer as ti
    from dsv4bench.cases import indexer_case, inputs
    from dsv4bench.cases.case import Case
    from dsv4bench.measure import timing

    for spec in PAGED_CASES:
        model, batch, s_q, ctx = spec.split(":")
        case = _indexer_case(Case, model, 0, int(ctx), int(batch), int(s_q))
        x = inputs.make_inputs(case, "cuda")
        args = (x["q"], x["kv_cache"], x["weights"], x["context_lens"], x["block_table"],
                indexer_case.keys(case))  # fmt: skip
        base = None
        for keys_m in (False, True):
            launch, out = ti.paged_launcher(*args, keys_m=keys_m)
            launch()
            ms = timing.measure(launch, **kw)["median_ms"]
            got = out.clone()
            base = got if base is None else base
            fin = torch.isfinite(base)
            same_inf = bool((fin == torch.isfinite(got)).all())
            rel = ((got[fin] - base[fin]).norm() / base[fin].norm()).item()
            print(f"paged {spec:28s} keys_m={int(keys_m)} {ms:8.4f} ms rel {rel:.2g} "
                  f"inf-match {same_inf}", flush=True)  # fmt: skip
        del x
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("prefixes", nargs="*", default=DEFAULT_CASES)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--no-indexer", action="store_true")
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--defaults-only", action="store_true", help="only the shipped configs")
    ap.add_argument("--compile-one", nargs=2, metavar=("PREFIX", "INDEX"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.compile_one:
        err = _compile((a.compile_one[0], int(a.compile_one[1])))
        print(err, end="")
        return 1 if err else 0
    from dsv4bench import backends

    backends.setup()
    kw = dict(device="cuda", warmup=3, iters=20, flush_l2=True, timer="events")
    if a.defaults_only:
        global WIDE_FP8, NARROW_FP8, WIDE_BF16, NARROW_BF16, INDEXER_TILES
        WIDE_FP8 = NARROW_FP8 = WIDE_BF16 = NARROW_BF16 = []
        INDEXER_TILES = [None]
    if not a.no_attention:
        cases = _cases(a.prefixes)
        work = [(p, i) for p, c in zip(a.prefixes, cases, strict=True)
                for i in range(len(_configs(c.num_heads, _layout(c), c.d_qk)))]  # fmt: skip
        broken = set()
        with ThreadPoolExecutor(a.jobs) as pool:
            for job, err in zip(work, pool.map(_compile_apart, work), strict=True):
                if err:
                    print("compile:", err, flush=True)
                    broken.add(job)
        _attention(a.prefixes, kw, broken)
    if not a.no_indexer:
        _indexer(kw)
        _paged(kw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
