"""A backend whose kernel library ends the process that loads it: `provider()` (and so
`supports()`, as TileLang's checks import tvm_ffi) raises SIGBUS, as a cut `.so` in the kernels
folder does when mapped. `backends` and `plan` must survive it (commands/isolated.py)."""

from __future__ import annotations

import os
import signal

from dsv4bench.backends import Backend, register


class LoadsBadly(Backend):
    name = "loads-badly"
    archs = ("cpu", "sm90")
    ops = ("decode",)

    def provider(self):
        os.kill(os.getpid(), signal.SIGBUS)

    def supports(self, case, arch):
        return super().supports(case, arch) or self.provider()


register(LoadsBadly())
