"""temporary: A/B of Config.lean on the narrow/alternate Gluon consumers (not committed)."""
import dataclasses, sys
sys.path.insert(0, "tools")
import torch
from triton_attention_sweep import _cases, _launch, _as_output, _layout
from dsv4bench import backends
from dsv4bench.cases import inputs
from dsv4bench.measure import metrics, timing
from dsv4bench.backends import triton_attention as ta

backends.setup()
kw = dict(device="cuda", warmup=3, iters=20, flush_l2=True, timer="events")
C = ta.Config
ALT576 = C(32, 64, 8, 1, True, True, 64, 48, True, True, True)
ALT = lambda **k: dataclasses.replace(ALT576, **k)
R = lambda **k: dict(half_release=True, **k)
runs = {
    "prefill-v3.2-v32-h32-t4096-": [None, R(chunk=32), R(chunk=32, producer_regs=56), R(chunk=16)],
    "prefill-v4-flash-v4-h32-t4096-": [None, R(chunk=32), R(chunk=32, producer_regs=56), R(chunk=16)],
    "prefill-v3.2-v32-h16-t4096-": [None, R(chunk=32)],
    "prefill-v4-flash-v4-h16-t4096-": [None, R(chunk=32)],
    "decode-v3.2-v32-h16-b64-": [None, R(chunk=32, producer_regs=96), dict(chunk=32, producer_regs=96)],
}
fm = backends.get("flashmla")
only = sys.argv[1:]
for prefix, cfgs in runs.items():
    if only and not any(prefix.startswith(o) for o in only):
        continue
    case = _cases([prefix])[0]
    x = inputs.make_inputs(case, "cuda")
    ref_ms = timing.measure(fm.prepare(case, x, "cuda").run, **kw)["median_ms"]
    print(f"{case.case_id:52s} flashmla {ref_ms:.4f} ms", flush=True)
    default = ta.config_for(case.num_heads, _layout(case), True, case.d_qk)
    want = None
    for c in cfgs:
        cfg = default if c is None else (dataclasses.replace(default, **c) if isinstance(c, dict) else c)
        try:
            launch = _launch(case, x, cfg)
            ms = [timing.measure(launch.run, **kw)["median_ms"] for _ in range(2)]
            got = _as_output(case, x, launch.run())
            got = type(got)(got.out.clone(), got.lse.clone())
            want = want or got
            cos = metrics.accuracy(want, got).get("cos_diff")
            print(f"   {cfg}: {ms[0]:.4f} / {ms[1]:.4f} ms  ratio {ref_ms / min(ms):.3f}  cos-vs-default {cos:.2g}", flush=True)
        except Exception as e:
            print(f"   {cfg}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
    del x
    torch.cuda.empty_cache()
