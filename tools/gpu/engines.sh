#!/usr/bin/env bash
# GPU rows of issue 13 items 4-6 (docs/engines.md), one sm90 GPU, about 6 minutes on an H200.
# Run from the repository root with PYTHONPATH=.:/tmp/site (FlashInfer wheels installed there)
# and one GPU visible:  tools/gpu/engines.sh OUT
# OUT/run gets ONE run directory (results.jsonl + serving rows) of three scenarios run together,
# so that route `safe` of the sglang scenario reads the limit row measured in the same run:
#   scenarios/compare/engines_sm90.yaml        page_split rows (torch, triton: 10 jobs) and the
#                                              decode-kernel route's chunk limit of V4-Flash at
#                                              TP 8 on FlashMLA (tokens 11600..11650, ~8 probes)
#   scenarios/serving/sglang_25502_sm90.yaml   sglang #25502's prompts/chunks at TP 8, 5 routes,
#                                              dequant read|pool, on flashmla, triton, flashinfer
#                                              (296 jobs; FlashMLA's decode route is expected to
#                                              crash on the one-chunk 13302/30352 prompts)
#   scenarios/serving/v4_flash_backends_sm90.yaml  TPOT per backend + C128 index per step (88)
# then OUT/report (report.md, report.html, PNGs: "Serving per backend" has the tables the
# #25502 finding is read from). Logs: OUT/env.txt, OUT/run.log, OUT/report.log.
# Exit status: the run's (1 when a case failed unexpectedly: the decode-route crashes count).
set -uo pipefail
out=${1:?usage: tools/gpu/engines.sh OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export DSV4BENCH_FLASHMLA_LIB=${DSV4BENCH_FLASHMLA_LIB:-.kernels/flashmla-vllm-0.26.0}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-jit}
log() { echo "== $(date +%T) $*" | tee -a "$out/run.log"; }
scenarios=(
  scenarios/compare/engines_sm90.yaml
  scenarios/serving/sglang_25502_sm90.yaml
  scenarios/serving/v4_flash_backends_sm90.yaml
)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1
  echo "DSV4BENCH_FLASHMLA_LIB=$DSV4BENCH_FLASHMLA_LIB"
  git rev-parse HEAD 2>/dev/null
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

log "run (limit 330 s): ${scenarios[*]}"
timeout 330 python3 -m dsv4bench.cli run "${scenarios[@]}" --arch sm90 --out "$out/run" \
  2>&1 | tee -a "$out/run.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 124 ] || [ "$rc" -eq 143 ]; then
  # cut short: finish what is left (finished jobs are skipped) and write the serving rows once
  log "run cut short (rc $rc): --resume (limit 40 s)"
  timeout 40 python3 -m dsv4bench.cli run "${scenarios[@]}" --arch sm90 --out "$out/run" \
    --resume 2>&1 | tee -a "$out/run.log"
  rc=${PIPESTATUS[0]}
fi
log "run rc $rc"

log "report (limit 60 s)"
timeout 60 python3 -m dsv4bench.cli report "$out/run" --out "$out/report" 2>&1 | tee "$out/report.log"
log "done"
exit "$rc"
