#!/usr/bin/env bash
# GPU rows for issue 22 (audit branch), one call on one H100, after `source tools/gpu/setup.sh`:
#   16  scenarios/compare/v32_scales_sm90.yaml: V3.2 pow2/raw scales on flashmla and
#       flashinfer-e4m3, each judged on its kernel's scale reading           -> OUT/v32-scales/
#   17  scenarios/compare/c128_long_context_sm90.yaml: V4-Flash C128 decode at 128K and 500K
#       context, FlashMLA's extra width padded to 64                          -> OUT/c128/
#   19  tools/profile_runner.py on the first 40 jobs of scenarios/sm90/decode_batch.yaml (where
#       a job's time goes outside the kernels); the sm90 prefill limit search alone (probes with
#       spare workers); then `make bench ARCH=sm90` for the time left     -> OUT/*.txt, OUT/bench/
#   tools/gpu/audit.sh OUT [SECONDS [STEP...]]  (SECONDS: the call's budget, default 170; STEPs:
#   v32-scales c128 profile limit bench, default all). Run dirs are packed into OUT/rows.tar.
set -uo pipefail
out=${1:?usage: tools/gpu/audit.sh OUT [SECONDS]}
budget=${2:-170}
steps=" ${*:3} "
[ "$steps" = "  " ] && steps=" v32-scales c128 profile limit bench "
start=$(date +%s)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit ${DSV4BENCH_GIT_COMMIT:-?}"; } > "$out/gpu.txt"

step() {  # step NAME LOG COMMAND...: run it within what is left of the budget, log its time
  local name=$1 log=$2 left t
  shift 2
  case "$steps" in *" ${name%% *} "*) ;; *) return ;; esac
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 10 ]; then echo "$name: skipped, budget spent" >> "$out/times.txt"; return; fi
  t=$(date +%s)
  timeout "$left" "$@" > "$out/$log" 2>&1
  echo "$name: exit $? in $(($(date +%s) - t)) s" >> "$out/times.txt"
}

cat > /tmp/limit_only.yaml <<'YAML'
name: sm90-prefill-chunk
op: prefill
arch: [sm90]
backends: [flashmla]
seed: 0
timing: {warmup: 2, iters: 20, flush_l2: true, timer: both}
defaults: {context_len: 32768}
limit:
  axis: tokens
  lo: 8192
  hi: 16384
  backend: flashmla
  model: v4-flash
  route: decode-kernel
  tags: [sched-smem-limit]
YAML
cli=(python3 -m dsv4bench.cli run --arch sm90 --quiet)
step v32-scales v32-scales.log "${cli[@]}" scenarios/compare/v32_scales_sm90.yaml --out "$out/v32-scales"
step c128 c128.log "${cli[@]}" scenarios/compare/c128_long_context_sm90.yaml --out "$out/c128"
step profile profile-decode-batch.txt python3 tools/profile_runner.py scenarios/sm90/decode_batch.yaml --max-jobs 40
step "limit (the sm90 chunk-limit search alone)" limit.log python3 -m dsv4bench.cli run /tmp/limit_only.yaml --arch sm90 --out "$out/limit"
step "bench (make bench ARCH=sm90, cut at the budget)" bench.log make bench ARCH=sm90 OUT="$out/bench"
dirs=$(cd "$out" && ls -d */ 2>/dev/null)
[ -n "$dirs" ] && (cd "$out" && tar -cf rows.tar $dirs && rm -rf $dirs)
cat "$out/times.txt"
