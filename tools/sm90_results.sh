#!/usr/bin/env bash
# The command behind the committed sm90 results (results/sm90/<gpu>-*): run on a GPU machine
# from the repository root, with FlashMLA's op library extracted into .kernels/
# (../shared/tools/prebuilt-flashmla.sh .kernels).
#   1. make bench ARCH=sm90, twice back to back (run-to-run agreement)
#   2. the V4-Flash serving scenario, resumed on a copy of run 1 (its limit row feeds `safe`)
#   3. the GPU tests, and pytest --benchmark-only over the decode batch scenario
#   4. a report per run directory
set -uo pipefail
export DSV4BENCH_FLASHMLA_LIB=${DSV4BENCH_FLASHMLA_LIB:-$(ls -d .kernels/flashmla-vllm-* | head -n 1)}
export PYTHONPATH=. PYTHONUNBUFFERED=1
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())")
dest=${DEST:-results/sm90}
mkdir -p "$dest"
log() { echo "== $(date +%T) $*"; }

log "bench 1"; make bench ARCH=sm90 OUT="$dest/$gpu-bench-1"
log "bench 2"; make bench ARCH=sm90 OUT="$dest/$gpu-bench-2"
log "serving"
mkdir -p "$dest/$gpu-serving"
cp "$dest/$gpu-bench-1/results.jsonl" "$dest/$gpu-serving/results.jsonl"
python3 -m dsv4bench.cli run scenarios/sm90/*.yaml scenarios/serving/*sm90.yaml \
  --arch sm90 --out "$dest/$gpu-serving" --resume
log "gpu tests"; python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -n 15 | tee "$dest/$gpu-gpu-tests.txt"
log "pytest-benchmark"
python3 -m pytest benchmarks --benchmark-only -q -p no:cacheprovider \
  --scenario scenarios/sm90/decode_batch.yaml --flashmla-lib "$DSV4BENCH_FLASHMLA_LIB" \
  --benchmark-json "$dest/$gpu-pytest-benchmark.json" 2>&1 | tail -n 5 | tee "$dest/$gpu-pytest-benchmark.txt"
for run in "$dest/$gpu"-bench-1 "$dest/$gpu"-bench-2 "$dest/$gpu"-serving; do
  log "report $run"; python3 -m dsv4bench.cli report "$run"
done
python3 -m dsv4bench.cli compare "$dest/$gpu-bench-1" "$dest/$gpu-bench-2" --out "$dest/$gpu-bench-2"
log "done"
