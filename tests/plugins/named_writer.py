"""A cache writer that names its kernel, for the serving tests (a CPU run whose TTFT/TPOT
parts sum a writer naming the kernel it took, as vllm-ops's concat_and_cache_mla does on a
GPU). It runs the oracle's writer: its rows are judged byte for byte like any writer's."""

from __future__ import annotations

from dsv4bench.backends import Prepared, register
from dsv4bench.backends.base import Backend
from dsv4bench.cases.case import ARCHS
from dsv4bench.cases.oracle import oracle_call

KERNEL = "test writer (the oracle's, named)"


class NamedWriter(Backend):
    name = "named-writer"
    description = "the oracle's cache writer under a kernel name (tests)"
    archs = ARCHS
    ops = ("cache_write",)
    layouts = ("v32",)

    def prepare(self, case, inputs, device):
        return Prepared(run=oracle_call(case, inputs), info={"kernel": KERNEL})


register(NamedWriter())
