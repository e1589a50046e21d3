#!/bin/bash
# Issue 19 evidence on one Hopper GPU: the fa3 and deepgemm backends, in one call. Run from the
# repository root after `source tools/gpu/setup.sh`, with OUT set. Every step has its own time
# limit (a step cut short keeps the rows it wrote); logs and run directories go to $W and come
# back as one archive, $OUT/evidence.tgz (a call returns at most 8 files).
#   GPU tests (real kernels vs the oracle); the compare scenario for fa3 and FlashMLA (FlashInfer's
#   rows: results/sm90/flashinfer-fa3/run); the indexer scenario for DeepGEMM (the Triton
#   indexer's: results/sm90/indexer-h100/indexer); DeepGEMM's paged-batch limit; fa3 on the
#   shipped decode and prefill scenarios; the engine-preset serving scenarios.
set -u
W=${W:-/tmp/evidence}
mkdir -p "$W"
step() {  # step NAME SECONDS COMMAND...: log to $W/NAME.log, say how it ended
  local name=$1 secs=$2
  shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" >"$W/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$W/steps.txt"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$W/gpu.txt"
python -c "import torch; print('torch', torch.__version__)" >>"$W/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: the runs alone
step backends 40 python -m dsv4bench.cli backends
step gpu-tests 70 python -m pytest -q -rs -s -m gpu tests/backends/test_fa3_backend.py \
  tests/backends/test_deepgemm_backend.py -p no:cacheprovider
fi
step compare 90 python -m dsv4bench.cli run scenarios/compare/backends_sm90.yaml --backend fa3 --backend flashmla \
  --out "$W/compare"
step indexer 45 python -m dsv4bench.cli run scenarios/indexer/sm90.yaml --backend deepgemm --out "$W/indexer"
step deepgemm-limit 70 python -m dsv4bench.cli run scenarios/indexer/deepgemm_limits_sm90.yaml --out "$W/deepgemm-limit"
step sm90-fa3 70 python -m dsv4bench.cli run scenarios/sm90/decode_batch.yaml scenarios/sm90/prefill_chunk.yaml \
  --backend fa3 --out "$W/sm90-fa3"
step presets 110 python -m dsv4bench.cli run scenarios/serving/presets_v32_sm90.yaml \
  scenarios/serving/presets_v4_flash_sm90.yaml --out "$W/presets"
tar -czf "${OUT:?set OUT}/evidence.tgz" -C "$W" .
cp "$W/steps.txt" "$OUT/"
