"""A/B of two versions of the Gluon attention kernel in one process (same inputs, same GPU):
each case's default config launched with the previous kernel (PREV: a copy of the module's
source at the base commit) and the working tree's, interleaved A B A B, median of each.

    PREV=.ab/gluon_attention_prev.py python3 results/sm90/triton-gluon3-h100/sweeps/ab_kernels.py
"""
import importlib.util
import os
import sys

sys.path.insert(0, "tools")
import torch  # noqa: E402
from triton_attention_sweep import _as_output, _cases, _launch, _layout  # noqa: E402

from dsv4bench import backends  # noqa: E402
from dsv4bench.backends import triton_attention as ta  # noqa: E402
from dsv4bench.backends import triton_jit  # noqa: E402
from dsv4bench.cases import inputs  # noqa: E402
from dsv4bench.measure import metrics, timing  # noqa: E402

CASES = ["prefill-v3.2-v32-h32-", "prefill-v4-flash-v4-h32-", "prefill-v3.2-v32-h16-",
         "prefill-v4-flash-v4-h16-", "prefill-v4-flash-v4-h8-", "prefill-v3.2-v32-h8-",
         "decode-v3.2-v32-h32-b64-", "decode-v3.2-v32-h16-b64-", "decode-v4-flash-v4-h16-b64-",
         "decode-v4-flash-v4-h32-b64-", "decode-v3.2-v32-h128-b1-", "decode-v4-flash-v4-h64-b1-",
         "decode-v3.2-v32-h128-b64-", "decode-v4-pro-v4-h128-b64-", "prefill-v4-flash-v4-h64-t4096-",
         "prefill-v3.2-v32-h128-t4096-"]

spec = importlib.util.spec_from_file_location("gluon_attention_prev", os.environ["PREV"])
prev = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prev)
key = ("gluon_attention", "attn", False)
backends.setup()
kw = dict(device="cuda", warmup=3, iters=20, flush_l2=True, timer="events")
for prefix in sys.argv[1:] or CASES:
    case = _cases([prefix])[0]
    x = inputs.make_inputs(case, "cuda")
    cfg = ta.config_for(case.num_heads, _layout(case), True, case.d_qk)
    launch = _launch(case, x, cfg)
    ms = {"prev": [], "new": []}
    outs = {}
    triton_jit.kernel(*key[:2], torch.device("cuda"))  # the working tree's, built once
    new = triton_jit._BUILT[key]
    for _ in range(2):
        for name, fn in (("prev", prev.KERNELS["attn"]), ("new", new)):
            triton_jit._BUILT[key] = fn
            ms[name].append(timing.measure(launch.run, **kw)["median_ms"])
            got = _as_output(case, x, launch.run())
            outs[name] = type(got)(got.out.clone(), got.lse.clone())
    triton_jit._BUILT[key] = new
    cos = metrics.accuracy(outs["prev"], outs["new"]).get("cos_diff")
    p, n = min(ms["prev"]), min(ms["new"])
    print(f"{case.case_id:52s} prev {p:.4f} new {n:.4f} ms ({n / p - 1:+.1%}) "
          f"samples prev {ms['prev']} new {ms['new']} cos(prev, new) {cos:.2g}", flush=True)
    del x
    torch.cuda.empty_cache()
