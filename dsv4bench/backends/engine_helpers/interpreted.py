"""What an engine's Triton writer needs from Triton 3.6's CPU interpreter beyond
triton/jit.py's `interpreting` (nothing when compiled for a GPU).

The interpreter rounds float -> e4m3 (OCP, tl.float8e4nv) wrongly: its _convert_float adds the
round bit after masking the mantissa, so a carry into the exponent is lost (-127.5 becomes -64,
not -128), and ties go up, not to even. A GPU converts with cvt.rn.satfinite (round to nearest
even, saturating). While `e4m3_rounding` is active, the interpreter's conversions to e4m3 are
torch's (round to nearest even), saturated at +-448 as the GPU's: an interpreted writer's bytes
are then the ones its arithmetic asks for, so a CPU test judges the kernel, not the interpreter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

E4M3_MAX = 448.0


def to_e4m3_bits(data: np.ndarray, source: str) -> np.ndarray:
    """uint8 e4m3 bit patterns of interpreter data holding `source` values ("fp32", "bf16"
    stored as uint16 bits, "fp16"), rounded to nearest even, saturated."""
    if source == "bf16":
        x = torch.from_numpy(np.ascontiguousarray(data).view(np.int16)).view(torch.bfloat16)
    else:
        x = torch.from_numpy(np.ascontiguousarray(data))
    x = x.float().clamp(-E4M3_MAX, E4M3_MAX)  # NaN stays NaN
    return x.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(data.shape)


@contextlib.contextmanager
def e4m3_rounding(active: bool):
    if not active:
        yield
        return
    import triton.language as tl
    import triton.runtime.interpreter as interp

    convert = interp._convert_float
    sources = {tl.float32: "fp32", tl.bfloat16: "bf16", tl.float16: "fp16"}

    def rounded(data, input_dtype, output_dtype, rounding_mode):
        if output_dtype == tl.float8e4nv and input_dtype in sources:
            return to_e4m3_bits(data, sources[input_dtype])
        return convert(data, input_dtype, output_dtype, rounding_mode)

    interp._convert_float = rounded
    try:
        yield
    finally:
        interp._convert_float = convert


def on_device(call: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """`call` as it is on a GPU (nothing added to the timed call); on the CPU, `call` inside
    `interpreted`."""
    if device.type != "cpu":
        return call

    def run():
        with interpreted(True):
            return call()

    return run


@contextlib.contextmanager
def interpreted(active: bool):
    """triton/jit.py's `interpreting` and e4m3_rounding, both only when `active`."""
    from dsv4bench.backends.triton.jit import interpreting

    with interpreting(active), e4m3_rounding(active):
        yield
