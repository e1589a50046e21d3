"""Backends that fail on purpose, for the runner, compare and report tests.

crashy: kills its own process on batch_size >= 4 (like FlashMLA's exit(1) on a scheduler error;
batch 6: SIGKILL, as the out-of-memory killer),
hangs when seed == 3, raises when seed == 2; raises a CUDA error when seed == 5 (caught in
the worker, which answers `crash` and then exits, slowly: as a CUDA context's teardown is);
otherwise it is the oracle.
slowed: the oracle plus a sleep (a deliberately slowed backend).
wrong: the oracle with its output scaled (a deliberately wrong backend).
isolated: the oracle, recording its worker's pid; instances with a `build` get their own worker.
copying: the oracle over its own copies of the inputs (as adapters convert them), which it
declares as Prepared.buffers; stale: the same, but its indices copy is left out of the buffers
(a refill leaves the captured batch's indices behind).
chatty: the oracle, printing at the C level (fd 2) what CUTLASS prints on every call when it
cannot build a TMA descriptor, as FA3 sparse does on a zero-extent segment (vLLM issue 56563).
"""

from __future__ import annotations

import atexit
import os
import signal
import time

from dsv4bench.backends import Backend, Output, Prepared, register
from dsv4bench.cases.oracle import oracle_call


class _Oracle(Backend):
    archs = ("cpu", "sm90", "sm100", "sm120")
    ops = ("decode", "prefill")

    def prepare(self, case, inputs, device):
        return Prepared(run=oracle_call(case, inputs))


class Crashy(_Oracle):
    name = "crashy"

    def prepare(self, case, inputs, device):
        if case.batch_size == 6:  # as the host's out-of-memory killer would
            os.kill(os.getpid(), signal.SIGKILL)
        if case.batch_size >= 4:
            print(f"crashy: fatal error at batch {case.batch_size}", file=os.sys.stderr, flush=True)
            os._exit(1)
        if case.seed == 3:
            if os.environ.get("CRASHY_HANGING"):  # tells a test that the hang has begun
                open(os.environ["CRASHY_HANGING"], "w").close()
            time.sleep(3600)
        if case.seed == 2:
            raise RuntimeError("crashy refuses seed 2")
        if case.seed == 5:
            atexit.register(time.sleep, 1.0)  # the worker's exit after its answer takes a while
            raise RuntimeError("CUDA error: an illegal memory access was encountered (crashy)")
        return super().prepare(case, inputs, device)


class Slowed(_Oracle):
    name = "slowed"
    delay_s = float(os.environ.get("DSV4BENCH_TEST_DELAY", "0.02"))

    def prepare(self, case, inputs, device):
        call = oracle_call(case, inputs)

        def run():
            time.sleep(self.delay_s)
            return call()

        return Prepared(run=run)


class Wrong(_Oracle):
    name = "wrong"
    options = {"factor": 1.01}  # what the output is scaled by (1.0: right again)

    def __init__(self, factor: float = 1.01):
        self.factor = factor

    def prepare(self, case, inputs, device):
        call = oracle_call(case, inputs)
        return Prepared(run=call, finish=lambda o: Output(o.out * self.factor, o.lse))


class Isolated(_Oracle):
    """Records its process id; an instance with a `build` keeps a worker of its own, as two
    FlashMLA builds must (both register the same torch op names)."""

    name = "isolated"
    options = {"build": ""}

    def __init__(self, build: str = ""):
        self.build = build

    def process_key(self) -> str:
        return f"build={self.build}" if self.build else ""

    def prepare(self, case, inputs, device):
        return Prepared(run=oracle_call(case, inputs), info={"pid": os.getpid()})


class Chatty(_Oracle):
    name = "chatty"
    PRINTED = b"TMA Desc Addr:   0x7ffd\nError: Failed to initialize the TMA descriptor 1\n"

    def prepare(self, case, inputs, device):
        call = oracle_call(case, inputs)

        def run():
            os.write(2, self.PRINTED)  # as std::cerr: unbuffered, past Python's sys.stderr
            return call()

        return Prepared(run=run)


class Copying(_Oracle):
    name = "copying"
    forgets = ()  # input keys whose copies are left out of Prepared.buffers

    def prepare(self, case, inputs, device):
        own = {k: v.clone() if hasattr(v, "clone") else v for k, v in inputs.items()}
        keys = [k for k in sorted(own) if hasattr(own[k], "data_ptr") and k not in self.forgets]
        return Prepared(run=oracle_call(case, own), buffers=tuple(own[k] for k in keys))


class Stale(Copying):
    name = "stale"
    forgets = ("indices",)


for _b in (Crashy(), Slowed(), Wrong(), Isolated(), Chatty(), Copying(), Stale()):
    register(_b, replace=True)


class ReadsScalesAsBf16(_Oracle):
    """Reads V3.2 fp32 scales as bf16, as sm90 FlashMLA does."""

    name = "bf16-scales"

    def v32_scale_reading(self, arch):
        return "bf16"

    def prepare(self, case, inputs, device):
        return Prepared(run=oracle_call(case, inputs, "bf16"))


register(ReadsScalesAsBf16(), replace=True)
