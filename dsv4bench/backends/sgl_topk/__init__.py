"""sglang's JIT top-k kernels (fast_topk, DeepSeek-V4 top-k v2) for the `topk` op, built by
nvcc from the sglang wheel's sources through apache-tvm-ffi."""
