"""What an engine's Triton files need from Triton 3.6's CPU interpreter (nothing when compiled
for a GPU; the files are interpreted when TRITON_INTERPRET=1 was set before Triton's import).

The interpreter rounds float -> e4m3 (OCP, tl.float8e4nv) wrongly: its _convert_float adds the
round bit after masking the mantissa, so a carry into the exponent is lost (-127.5 becomes -64,
not -128), and ties go up, not to even. A GPU converts with cvt.rn.satfinite (round to nearest
even, saturating). While `interpreted` is active, the interpreter's conversions to e4m3 are
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
    """While active: conversions to e4m3 rounded as a GPU rounds them (to_e4m3_bits), and a
    loop `range(lo, hi)` over loaded scalars working (the interpreter converts them with int(),
    which NumPy >= 2.3 refuses for its 1-element arrays: __index__ takes the element, as
    triton/jit.py's `interpreting` does for the project's kernels). Both restored afterwards."""
    if not active:
        yield
        return
    import triton.language as tl
    import triton.runtime.interpreter as interp

    convert, patch_tensor = interp._convert_float, interp._patch_lang_tensor
    sources = {tl.float32: "fp32", tl.bfloat16: "bf16", tl.float16: "fp16"}

    def rounded(data, input_dtype, output_dtype, rounding_mode):
        if output_dtype == tl.float8e4nv and input_dtype in sources:
            return to_e4m3_bits(data, sources[input_dtype])
        return convert(data, input_dtype, output_dtype, rounding_mode)

    def patch_tensor_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._convert_float, interp._patch_lang_tensor = rounded, patch_tensor_index
    try:
        yield
    finally:
        interp._convert_float, interp._patch_lang_tensor = convert, patch_tensor
