#!/usr/bin/env bash
# GPU rows for issue 12.12 (polish branch): scenarios/serving/v4_flash_sm90.yaml now has chunks
# 11648 and 11672, between the measured decode-route limit (11622) and sglang's threshold
# (11673); its TTFT figure shows threshold:11673 crashing there and `safe` not. Runs the serving
# scenario with scenarios/sm90/prefill_chunk.yaml in one RUN_DIR (route `safe` reads that file's
# limit search), then the report.
#   PYTHONPATH=.:/tmp/site tools/gpu/polish.sh OUT      (one GPU visible)
# Each call runs at most 9 minutes and resumes where the last one stopped (--resume): call it
# again with the same OUT until the log says "finished". Estimate on an H100: 1877 jobs + 15
# limit probes, about 12-16 minutes in all (two calls): ~0.3 s per job as in
# results/sm90/h200-run.log, plus a worker restart for each of the 102 decode-route chunk
# cases above the limit that crash FlashMLA on purpose.
# Writes: OUT/serving/ (results.jsonl, report.md/html, ttft-v4-flash.png, ...), OUT/polish.log.
set -uo pipefail
out=${1:?usage: tools/gpu/polish.sh OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export DSV4BENCH_FLASHMLA_LIB=${DSV4BENCH_FLASHMLA_LIB:-.kernels/flashmla-vllm-0.26.0}
run="$out/serving"
resume=()
[ -f "$run/results.jsonl" ] && resume=(--resume)
{
  echo "== $(date +%T) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  timeout 540 python3 -m dsv4bench.cli run scenarios/sm90/prefill_chunk.yaml \
    scenarios/serving/v4_flash_sm90.yaml --arch sm90 --out "$run" "${resume[@]}"
  code=$?
  # exit 1 is expected: the decode-kernel route's crashes above the limit are serving cases,
  # not limit probes. 124: the 9 minutes ran out; call the script again to go on.
  echo "== $(date +%T) run exit $code"
  if [ "$code" -ne 124 ]; then
    timeout 300 python3 -m dsv4bench.cli report "$run" && echo "finished: $run/report.md"
  fi
} 2>&1 | tee -a "$out/polish.log"
