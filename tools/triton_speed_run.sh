#!/usr/bin/env bash
# The evidence command of issue 20 (results/sm90/triton-speed-h100): run on a GPU machine from
# the repository root after `source tools/gpu/setup.sh` (FlashMLA, DeepGEMM). Writes into
# $DEST (default $OUT):
#   gpu.txt              the GPU, torch, triton
#   gpu-tests.txt        the gpu-marked tests of the Triton kernels (attention, cache ops, indexer)
#   results.jsonl        dsv4bench run scenarios/sm90/triton_vs_flashmla.yaml (triton + flashmla)
#   indexer/results.jsonl  dsv4bench run scenarios/indexer/sm90.yaml (triton + deepgemm)
#   summary.txt, indexer/summary.txt   tools/triton_summary.py of each
#   *-run.log
# NO_TESTS=1 / NO_INDEXER=1 leave those parts out.
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
dest=${DEST:-$OUT}
run=${RUN_DIR:-/tmp/speed-run}
mkdir -p "$dest/indexer"
log() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$dest/gpu.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$dest/gpu.txt"
log "gpu tests"
[ -n "${NO_TESTS:-}" ] || timeout "${TESTS_S:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider -rA \
  tests/backends/test_triton_attention.py tests/backends/test_gluon_attention.py tests/backends/test_triton_backend.py \
  tests/backends/test_indexer_gpu.py \
  tests/backends/test_page_split.py 2>&1 | tail -n 40 > "$dest/gpu-tests.txt"
tail -n 3 "$dest/gpu-tests.txt"
log "attention rows"
timeout "${RUN_S:-300}" python3 -m dsv4bench.cli run scenarios/sm90/triton_vs_flashmla.yaml \
  --arch sm90 --backend triton --backend flashmla --out "$run/attention" --force \
  > "$dest/attention-run.log" 2>&1
tail -n 2 "$dest/attention-run.log"
cp "$run/attention/results.jsonl" "$dest/results.jsonl"
python3 tools/triton_summary.py "$dest/results.jsonl" > "$dest/summary.txt"
[ -n "${NO_INDEXER:-}" ] && { log "done (no indexer rows)"; exit 0; }
log "indexer rows"
timeout "${INDEXER_S:-150}" python3 -m dsv4bench.cli run scenarios/indexer/sm90.yaml \
  --arch sm90 --backend triton --backend deepgemm --out "$run/indexer" --force \
  > "$dest/indexer-run.log" 2>&1
tail -n 2 "$dest/indexer-run.log"
cp "$run/indexer/results.jsonl" "$dest/indexer/results.jsonl"
python3 tools/triton_summary.py "$dest/indexer/results.jsonl" > "$dest/indexer/summary.txt"
tail -n 4 "$dest/summary.txt" "$dest/indexer/summary.txt"
log "done"
