"""Triton, imported when first needed, and the project's Triton kernels built from their
sources in kernels/: compiled (JITFunction) for CUDA tensors, interpreted for CPU tensors
(tests, tiny shapes; Triton's interpreter copies the tensors' whole storages per launch).

The import graph of the Triton backend is a tree: backend -> attention, indexer, topk, cache_ops ->
jit -> kernels.* (importlib, once Triton is found); nothing imports upwards (the kernels'
device_fn lives in kernels/ itself).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from dsv4bench.backends.base import Unsupported

NOT_FOUND = "Triton not found: pip install triton"
_BUILT: dict[tuple[str, str, bool], Any] = {}


def load():
    """The triton module; Unsupported when it cannot be imported."""
    try:
        import triton
    except ImportError as e:
        raise Unsupported(NOT_FOUND) from e
    return triton


def has_gluon() -> bool:
    """Whether this Triton has Gluon's Hopper ops (Triton 3.5+): the producer/consumer
    attention kernel needs them."""
    try:
        from triton.experimental.gluon.language.nvidia import hopper  # noqa: F401
    except ImportError:
        return False
    return True


def kernel(module: str, name: str, device) -> Any:
    """kernels.<module>.KERNELS[name], compiled for a GPU tensor's device or interpreted for
    a CPU tensor's; built once."""
    interpret = device.type == "cpu"
    key = (module, name, interpret)
    if key not in _BUILT:
        load()
        fn = importlib.import_module(f"dsv4bench.backends.triton.kernels.{module}").KERNELS[name]
        if hasattr(fn, "is_gluon"):  # already a GluonJITFunction: compiled only
            if interpret:
                raise Unsupported(f"{module}.{name} is a Gluon kernel: it needs an sm90 GPU")
            _BUILT[key] = fn
        elif interpret:
            from triton.runtime.interpreter import InterpretedFunction

            _BUILT[key] = InterpretedFunction(fn)
        else:
            from triton.runtime.jit import JITFunction

            _BUILT[key] = JITFunction(fn)
    return _BUILT[key]


@contextlib.contextmanager
def interpreting(active: bool):
    """What an interpreted launch needs from Triton 3.6's interpreter (nothing when compiled):
    - tl.max / tl.sum are @jit functions, callable inside an interpreted kernel only when
      Triton was imported with TRITON_INTERPRET=1: they are swapped for interpreted copies, so
      the environment variable (which would leak into other tests) is never needed;
    - a loop `range(lo, hi)` over scalars converts them with int(), which numpy >= 2.3 refuses
      for the interpreter's 1-element arrays: __index__ is made to take the element.
    Both are restored afterwards, and so is every attribute of triton.language the interpreter
    patched: an interpreted device function (tl.max here) patches the language for good, and
    a kernel compiled later in the same process (Gluon's, on a GPU or for sm90 in the tests)
    would be traced by the interpreter's builder."""
    if not active:
        yield
        return
    import triton.language as tl
    import triton.runtime.interpreter as interp

    patched = (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base)
    before = [dict(vars(obj)) for obj in patched]
    saved = {name: getattr(tl, name) for name in ("max", "sum")}
    patch_tensor = interp._patch_lang_tensor

    def patch_tensor_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    try:
        for name, fn in saved.items():
            setattr(tl, name, interp.InterpretedFunction(fn.fn))
        interp._patch_lang_tensor = patch_tensor_index
        yield
    finally:
        interp._patch_lang_tensor = patch_tensor
        for name, fn in saved.items():
            setattr(tl, name, fn)
        for obj, attrs in zip(patched, before, strict=True):
            _restore(obj, attrs)


def _restore(obj, attrs: dict) -> None:
    """obj's attributes back to `attrs` (a copy of vars(obj)): changed ones reset, added ones
    removed."""
    for name, value in list(vars(obj).items()):
        if name not in attrs:
            delattr(obj, name)
        elif value is not attrs[name]:
            setattr(obj, name, attrs[name])
