"""Kernel sources of the project's Triton kernels: plain Python functions that
dsv4bench.backends.triton.jit builds into compiled kernels (CUDA tensors) or interpreted ones
(CPU tensors). `cache`, `attention`, `indexer`, `topk` and `gluon_attention` (a Gluon
kernel: compiled only, for GPUs; its parts in gluon_parts, gluon_producer and gluon_resident)
import Triton when they load, so only
jit imports them, after it has found Triton; `layout` (the byte offsets and layout ids
the kernels and their host modules share) imports no Triton. Nothing here imports the host
modules (backend, attention, indexer, topk, cache_ops) or jit."""


def device_fn(fn):
    """A device function of the kernels here: inlined by the compiler (a JITFunction), called
    as the plain Python function inside an interpreted kernel. Imports Triton when called, i.e.
    when a kernel module loads."""
    from triton.runtime.jit import JITFunction

    class DeviceFn(JITFunction):
        def __call__(self, *args, **kwargs):
            return self.fn(*args, **kwargs)

    return DeviceFn(fn)
