#!/bin/bash
# The one GPU command of the indexer work (issue 15), run from the checkout root with $OUT set:
# the GPU tests of the Triton indexer, the indexer scenario (oracle vs Triton, DeepGEMM where it
# loads), then as many limit probes as the time left allows (each probe is a fresh process).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt" 2>&1
timeout 10 python3 -c "import deep_gemm" >> "$OUT/gpu.txt" 2>&1 || echo "deep_gemm: import failed" >> "$OUT/gpu.txt"
S=$(date +%s)
timeout 35 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/backends/test_indexer_gpu.py \
  > "$OUT/gpu-tests.txt" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - S )) s" >> "$OUT/gpu-tests.txt"
S=$(date +%s)
timeout 75 python3 -m dsv4bench.cli run scenarios/indexer/sm90.yaml --out "$OUT/indexer" \
  > "$OUT/run.log" 2>&1
echo "indexer run rc=$? in $(( $(date +%s) - S )) s" >> "$OUT/run.log"
S=$(date +%s)
timeout 18 python3 -m dsv4bench.cli run scenarios/indexer/limits_sm90.yaml --out "$OUT/limits" \
  > "$OUT/limits.log" 2>&1
echo "limits run rc=$? in $(( $(date +%s) - S )) s (timeout 18 s: partial)" >> "$OUT/limits.log"
