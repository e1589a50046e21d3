#!/usr/bin/env bash
# Issue 13 items 1-3 on one sm90 GPU, in order of value, each part under its own timeout
# (540 s in all; about 8.5 minutes expected on an H200):
#   1. scenarios/engines/flashmla_route_limits_sm90.yaml -> OUT/builds     (timeout 220 s)
#      the decode-kernel limit of the 0.33.0 build (to 16 tokens: 8 probes), the decode-mixed
#      limit of both builds (V3.2 TP 8, to 1024 tokens: 6 probes each), the 0.26.0
#      decode-kernel limit confirmed (11622 ok / 11623 fails: 2 probes); each probe a fresh
#      process, ~6 s when it crashes and ~11 s when it runs (results/sm90/h100-bench/run.log)
#   2. scenarios/engines/tp_route_crossover_sm90.yaml -> OUT/crossover     (timeout 170 s)
#      150 jobs on the 0.26.0 build, 10 of them expected crashes (a worker restart each)
#   3. scenarios/engines/flashmla_builds_sm90.yaml -> OUT/builds, --resume  (timeout 150 s)
#      the 96 cases of scenarios/sm90/*.yaml on both builds (192 jobs, one worker per build)
# A part cut by its timeout keeps the rows it wrote (`run --resume` goes on from them).
# Exit codes per part go to OUT/status.txt (124: timed out; 1: a failed case or an `error`
# probe: a stride check raising in a mixed-route probe is one).
# Afterwards, anywhere (CPU, seconds):
#   python3 -m dsv4bench.cli report OUT/builds OUT/crossover --out OUT/report
#   python3 -m dsv4bench.cli compare OUT/builds --backends flashmla-0.26 flashmla-0.33 \
#     --out OUT/compare-builds
#   tools/gpu/routes.sh OUT    (PYTHONPATH=. set, one GPU visible, both builds in .kernels/)
set -uo pipefail
out=${1:?output dir}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
for lib in .kernels/flashmla-vllm-0.26.0 .kernels/flashmla-vllm-0.33.0; do
  [ -e "$lib/_flashmla_C.abi3.so" ] || echo "missing $lib/_flashmla_C.abi3.so: its rows will say unsupported" \
    | tee -a "$out/status.txt"
done
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader \
  | tee "$out/gpu.txt"
start=$(date +%s)

part() {  # part NAME TIMEOUT_S RUN_ARGS...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" python3 -m dsv4bench.cli run "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc wall_s=$(( $(date +%s) - t0 ))" | tee -a "$out/status.txt"
}

part limits 220 scenarios/engines/flashmla_route_limits_sm90.yaml --out "$out/builds"
part crossover 170 scenarios/engines/tp_route_crossover_sm90.yaml --out "$out/crossover"
part builds 150 scenarios/engines/flashmla_builds_sm90.yaml --out "$out/builds" --resume
echo "total wall_s=$(( $(date +%s) - start ))" | tee -a "$out/status.txt"
