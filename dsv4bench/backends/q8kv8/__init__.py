"""sglang's FP8 x FP8 sparse MLA prefill for SM90 (backend `q8kv8`): where its sources come
from (sources.py), how nvcc builds them (jit.py) and how sglang calls it (backend.py)."""
