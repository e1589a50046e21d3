#!/usr/bin/env bash
# Issue 15's limit searches on one sm90 GPU: scenarios/indexer/limits_sm90.yaml (tokens at a 128K
# V3.2 prompt, context length at 8192-token chunks; Triton indexer and the torch oracle).
#   tools/gpu/indexer_limits.sh OUT      (PYTHONPATH=. set, one GPU visible)
set -uo pipefail
out=${1:?output dir}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader \
  | tee "$out/gpu.txt"
start=$(date +%s)
timeout 540 python3 -m dsv4bench.cli run scenarios/indexer/limits_sm90.yaml --out "$out/limits" \
  2>&1 | tee "$out/limits.log"
echo "wall_s $(( $(date +%s) - start ))" | tee -a "$out/limits.log"
python3 -m dsv4bench.cli report "$out/limits" >/dev/null
