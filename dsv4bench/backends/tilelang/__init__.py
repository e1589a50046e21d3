"""sglang's `tilelang` DSA backend: its TileLang sparse MLA kernel (bf16 KV, V3.2), prefill and
decode (backend.py), the call as sglang makes it (call.py), and what the kernel needs to load
and compile (runtime.py)."""
