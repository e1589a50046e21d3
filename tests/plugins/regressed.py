"""A new build of the `torch` backend that regressed, for the compare tests and CI.

DSV4BENCH_REGRESSION=slow: DSV4BENCH_REGRESSION_DELAY_S (default 0.25 s) slower per call, far
past any CPU noise; =wrong: outputs off by 1%.
Registered under the same name so that compare matches its rows with the baseline's.
"""

from __future__ import annotations

import os
import time

from dsv4bench.backends import Output, Prepared, register
from dsv4bench.backends.torch_ref import TorchReference, oracle_call

MODE = os.environ.get("DSV4BENCH_REGRESSION", "slow")
DELAY_S = float(os.environ.get("DSV4BENCH_REGRESSION_DELAY_S", "0.25"))


class RegressedTorch(TorchReference):
    is_oracle = False  # a changed build: its answers are under test

    def prepare(self, case, inputs, device):
        call = oracle_call(case, inputs)
        if MODE == "wrong":
            return Prepared(run=call, finish=lambda o: Output(o.out * 1.01, o.lse))

        def slow():
            time.sleep(DELAY_S)
            return call()

        return Prepared(run=slow)


register(RegressedTorch(), replace=True)
