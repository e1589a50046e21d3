"""vLLM's benchmark configs as scenarios (config.py: vllm bench attention configs -> a kernel
scenario), beside flashinfer_bench/."""
