#!/usr/bin/env bash
# Issue 15's limit searches on one sm90 GPU: scenarios/indexer/limits_sm90.yaml (tokens at a 128K
# V3.2 prompt, context length at 8192-token chunks; Triton indexer and the torch oracle).
#   tools/gpu/indexer_limits.sh OUT [SECONDS]   (PYTHONPATH=. set, one GPU visible; run again
#   to resume: finished searches are kept)
set -uo pipefail
out=${1:?output dir}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader \
  | tee -a "$out/gpu.txt"
limit=${2:-540}
resume=()
[[ -f $out/limits/results.jsonl ]] && resume=(--resume) # a second call goes on where one stopped
start=$(date +%s)
timeout "$limit" python3 -m dsv4bench.cli run scenarios/indexer/limits_sm90.yaml \
  --out "$out/limits" "${resume[@]}" 2>&1 | tee -a "$out/limits.log"
echo "wall_s $(( $(date +%s) - start ))" | tee -a "$out/limits.log"
python3 -m dsv4bench.cli report "$out/limits" >/dev/null
