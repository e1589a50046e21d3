"""A/B of Config variants of the shipped Gluon kernel against FlashMLA, in one process: each
case's variants timed in turn, ROUNDS times over, and each variant's output compared with the
first's (cos-vs-first). Run from the repository root after `source tools/gpu/setup.sh`:

    python3 results/sm90/triton-gluon4-h100/sweeps/ab_driver.py [case-prefix ...]
"""

import dataclasses
import sys

sys.path.insert(0, "tools")
import torch  # noqa: E402
from triton_attention_sweep import _as_output, _cases, _launch, _layout  # noqa: E402

from dsv4bench import backends  # noqa: E402
from dsv4bench.backends import triton_attention as ta  # noqa: E402
from dsv4bench.cases.oracle import oracle_call  # noqa: E402
from dsv4bench.cases import inputs  # noqa: E402
from dsv4bench.measure import metrics, timing  # noqa: E402

ROUNDS = 3
KW = dict(device="cuda", warmup=3, iters=20, flush_l2=True, timer="events")
PS = [dict(persist=True, producer_regs=r) for r in (80, 88)]
RUNS = {
    "prefill-v3.2-v32-h32-t4096-": [None, *PS],
    "prefill-v4-flash-v4-h32-t4096-": [None, *PS],
    "prefill-v3.2-v32-h8-t4096-": [None, PS[0]],
    "prefill-v4-flash-v4-h8-t4096-": [None, PS[0]],
}


def main() -> None:
    backends.setup()
    fm = backends.get("flashmla")
    only = sys.argv[1:]
    for prefix, variants in RUNS.items():
        if only and not any(prefix.startswith(o) for o in only):
            continue
        case = _cases([prefix])[0]
        x = inputs.make_inputs(case, "cuda")
        default = ta.config_for(case.num_heads, _layout(case), True, case.d_qk)
        cfgs = [default if v is None else dataclasses.replace(default, **v) for v in variants]
        runs, times, first = [], {i: [] for i in range(len(cfgs))}, None
        expected = oracle_call(case, x)()
        flashmla = fm.prepare(case, x, "cuda").run
        ref = []
        for i, cfg in enumerate(cfgs):
            try:
                launch = _launch(case, x, cfg)
                got = _as_output(case, x, launch.run())
                got = type(got)(got.out.clone(), got.lse.clone())
                first = first or got
                cos = metrics.accuracy(first, got).get("cos_diff")
                cos_o = metrics.accuracy(expected, got).get("cos_diff")
                runs.append((i, launch.run, f"{cos:.2g}  cos-vs-oracle {cos_o:.2g}"))
            except Exception as e:  # a variant that does not build is a result
                print(f"   {cfg}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
        for _ in range(ROUNDS):
            ref.append(timing.measure(flashmla, **KW)["median_ms"])
            for i, run, _cos in runs:
                times[i].append(timing.measure(run, **KW)["median_ms"])
        print(f"{case.case_id:52s} flashmla {' / '.join(f'{t:.4f}' for t in ref)} ms", flush=True)
        for i, _run, cos in runs:
            ts = times[i]
            print(f"   {cfgs[i]}: {' / '.join(f'{t:.4f}' for t in ts)} ms  "
                  f"ratio {min(ref) / min(ts):.3f}  cos-vs-first {cos}", flush=True)  # fmt: skip
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
