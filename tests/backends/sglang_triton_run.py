"""Run one sglang-triton entry point on tiny shapes on the CPU and print its accuracy against the
oracle as JSON: `python -m tests.backends.sglang_triton_run BUILD KERNEL`. The Triton kernels run
through Triton's interpreter, which must be chosen before Triton is imported (TRITON_INTERPRET=1
in the environment), so the tests run this in a process of its own. Autotuned kernels keep their
first config (the autotuner's benchmark needs a GPU driver)."""

from __future__ import annotations

import json
import sys

from dsv4bench.backends.sglang_triton import backend as sb
from dsv4bench.backends.sglang_triton import sources
from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.backends.triton.jit import interpreting
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.measure import metrics
from tests.factories import V4, make_case

TINY = dict(V4, num_heads=4, topk=64, window=64, page_size=64, batch_size=2)
CASES = {
    "mtp-sink": dict(TINY, s_q=2, context_len=256, sink=True),
    "plain": dict(TINY, context_len=256),
    "extra-sink": dict(TINY, context_len=512, extra_topk=64, compress_ratio=4, sink=True),
    "prefill": dict(TINY, op="prefill", route="decode-kernel", tokens=4, context_len=256),
}


def _first_configs_only() -> None:
    from triton.runtime.autotuner import Autotuner

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(sources.PREFIX):
            for value in vars(module).values():
                if isinstance(value, Autotuner):
                    value.configs = value.configs[:1]


def main(build: str, kernel: str) -> None:
    backend = sb.SglangTriton(lib=build, kernel=kernel)
    results = {}
    for label, fields in CASES.items():
        case = make_case(fields)
        x = make_inputs(case, "cpu")
        with interpreting(True):
            backend.kernel_ops()
            _first_configs_only()
            prepared = backend.prepare(case, x, "cpu")
            got = prepared.finish(prepared.run())
        acc = metrics.accuracy(oracle_call(case, x)(), got)
        results[label] = {
            "cos_diff": acc["cos_diff"],
            "lse_max_abs": acc["lse_max_abs"],
            "lse_mismatch": acc["lse_mismatch"],
            "nonfinite": acc["nonfinite"],
            "shape": list(got.out.shape),
            "lse": got.lse is not None,
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
