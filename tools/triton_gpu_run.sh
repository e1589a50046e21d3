#!/usr/bin/env bash
# The command behind results/sm90/triton-*: run on a GPU machine from the repository root, with
# FlashMLA's op library in .kernels/. Writes into $DEST (default results/sm90/triton-<gpu>):
#   gpu-tests.txt   the gpu-marked tests of the Triton kernels (attention, dequant/remap)
#   sweep.txt       launch-shape sweep vs FlashMLA on 8 cases (tools/triton_attention_sweep.py)
#   results.jsonl   dsv4bench run scenarios/sm90/triton_vs_flashmla.yaml (flashmla + triton)
#   report.md, run-log.txt, command.txt
set -uo pipefail
export DSV4BENCH_FLASHMLA_LIB=${DSV4BENCH_FLASHMLA_LIB:-.kernels/flashmla-vllm-0.26.0}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())")
dest=${DEST:-results/sm90/triton-$gpu}
run=${RUN_DIR:-/tmp/triton-run}
mkdir -p "$dest"
log() { echo "== $(date +%T) $*"; }
echo "DSV4BENCH_FLASHMLA_LIB=$DSV4BENCH_FLASHMLA_LIB tools/triton_gpu_run.sh  (DEST=$dest)" > "$dest/command.txt"
log "gpu tests"
timeout "${TESTS_S:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider -rA \
  tests/backends/test_triton_attention.py tests/backends/test_triton_backend.py 2>&1 | tail -n 40 > "$dest/gpu-tests.txt"
cat "$dest/gpu-tests.txt" | tail -n 12
if [ -z "${NO_SWEEP:-}" ]; then
  log "sweep"
  timeout "${SWEEP_S:-200}" python3 tools/triton_attention_sweep.py 2>&1 | tee "$dest/sweep.txt"
fi
log "run"
timeout "${RUN_S:-400}" python3 -m dsv4bench.cli run scenarios/sm90/triton_vs_flashmla.yaml \
  --arch sm90 --out "$run" --force 2>&1 | tail -n 120 > "$dest/run-log.txt"
tail -n 5 "$dest/run-log.txt"
cp "$run/results.jsonl" "$dest/results.jsonl"
python3 -m dsv4bench.cli report "$run" > /dev/null 2>&1 && cp "$run/report.md" "$dest/report.md"
python3 tools/triton_summary.py "$dest/results.jsonl" | tee "$dest/summary.txt"
log "done"
