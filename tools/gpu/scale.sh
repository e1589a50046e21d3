#!/usr/bin/env bash
# Issue 14's evidence: the shipped sm90 set (what `make bench ARCH=sm90` runs: scenarios/sm90/
# *.yaml on flashmla, triton, torch) on one GPU and on every GPU of the host, each timed.
#   tools/gpu/scale.sh OUT one   --gpus 0   -> OUT/one/{run/,wall.txt,rc.txt,gpus.txt,bench.log}
#   tools/gpu/scale.sh OUT all   --gpus all -> OUT/all/...; then OUT/same_cases.txt if one/ exists
# Run the two modes in separate calls (each within a 10-minute limit). A mode cut off by its
# timeout resumes when run again (--resume); wall.txt gets one line per attempt.
# Expects PYTHONPATH=.:/tmp/site; FlashMLA from $DSV4BENCH_FLASHMLA_LIB, else the vLLM 0.26.0
# build in .kernels/.
set -uo pipefail
out=${1:?usage: tools/gpu/scale.sh OUT one|all}
mode=${2:?usage: tools/gpu/scale.sh OUT one|all}
case $mode in
one) gpus=0 ;;
all) gpus=all ;;
*)
  echo "scale.sh: MODE must be one or all" >&2
  exit 2
  ;;
esac
if [[ -z ${DSV4BENCH_FLASHMLA_LIB:-} && -d .kernels/flashmla-vllm-0.26.0 ]]; then
  export DSV4BENCH_FLASHMLA_LIB=.kernels/flashmla-vllm-0.26.0
fi
export PYTHONUNBUFFERED=1
# both modes start from a cold Triton cache, so neither inherits the other's compiled kernels
TRITON_CACHE_DIR=$(mktemp -d /tmp/dsv4bench-triton-XXXX)
export TRITON_CACHE_DIR
trap 'rm -rf "$TRITON_CACHE_DIR"' EXIT
dir="$out/$mode"
mkdir -p "$dir"
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader >"$dir/gpus.txt" 2>&1
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}" >>"$dir/gpus.txt"

resume=()
[[ -f $dir/run/results.jsonl ]] && resume=(--resume)
start=$(date +%s.%N)
timeout 540 python3 -m dsv4bench.cli bench --arch sm90 --gpus "$gpus" --out "$dir/run" \
  "${resume[@]}" 2>&1 | tee -a "$dir/bench.log"
rc=${PIPESTATUS[0]}
end=$(date +%s.%N)
wall=$(python3 -c "print(f'{$end - $start:.1f}')")
echo "$wall s, --gpus $gpus, exit $rc${resume:+ (resumed)}" | tee -a "$dir/wall.txt"
echo "$rc" >"$dir/rc.txt"

timeout 150 python3 -m dsv4bench.cli report "$dir/run" >"$dir/report.log" 2>&1 ||
  echo "report: exit $?" >>"$dir/report.log"
if [[ -f $out/one/run/results.jsonl && -f $out/all/run/results.jsonl ]]; then
  python3 tools/same_cases.py "$out/one/run" "$out/all/run" | tee "$out/same_cases.txt"
fi
