"""sglang's Triton sparse MLA kernels as a backend: the entry points and what they take
(backend.py), sglang's calls of them (call.py), and the files loaded out of the sglang wheel's
build without importing sglang (sources.py)."""
