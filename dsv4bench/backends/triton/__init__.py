"""The project's own Triton and Gluon kernels: the backend (backend.py), its host modules
(attention, indexer, topk, cache_ops), launch rules (tuning.py), the builder (jit.py) and the kernel
sources (kernels/)."""
