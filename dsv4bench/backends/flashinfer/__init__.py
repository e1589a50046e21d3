"""FlashInfer's sparse MLA kernels, one module per GPU family (sm90, sm100, sm120) beside the
backend (backend.py) and its input conversions (convert.py)."""
