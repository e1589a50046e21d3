#!/bin/bash
# Issue 19 evidence on one Hopper GPU: the fa3 and deepgemm backends. Run from the repository
# root after `source tools/gpu/setup.sh`, with OUT set; every step has its own time limit and a
# step cut short keeps the rows it wrote.
#   a  GPU tests (real kernels vs the oracle), the compare scenario (every sm90 backend), the
#      indexer scenario, DeepGEMM's paged-batch limit (scenario + a finer probe)
#   b  fa3 on the shipped sm90 scenarios (the other backends' rows: earlier H100 runs) and the
#      engine-preset serving scenarios
set -u
O=${OUT:?set OUT}
step() {  # step NAME SECONDS COMMAND...: log to $O/NAME.log, say how it ended
  local name=$1 secs=$2
  shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" >"$O/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$O/steps.txt"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$O/gpu.txt"
python -c "import torch; print('torch', torch.__version__)" >>"$O/gpu.txt"
case "${1:-a}" in
a)
  step backends 60 python -m dsv4bench.cli backends
  step gpu-tests 100 python -m pytest -q -rs -s -m gpu tests/test_fa3_backend.py \
    tests/test_deepgemm_backend.py -p no:cacheprovider
  step compare 230 python -m dsv4bench.cli run scenarios/compare/backends_sm90.yaml --out "$O/compare"
  step indexer 70 python -m dsv4bench.cli run scenarios/indexer/sm90.yaml --out "$O/indexer"
  step deepgemm-limit 80 python -m dsv4bench.cli run scenarios/indexer/deepgemm_limits_sm90.yaml \
    --out "$O/deepgemm-limit"
  step limit-probe 40 python tools/engines_probe.py limit
  ;;
b)
  step sm90-fa3 240 python -m dsv4bench.cli run scenarios/sm90/decode_batch.yaml \
    scenarios/sm90/prefill_chunk.yaml scenarios/sm90/head_padding.yaml scenarios/sm90/layouts.yaml \
    --backend fa3 --out "$O/sm90-fa3"
  step presets 200 python -m dsv4bench.cli run scenarios/serving/presets_v32_sm90.yaml \
    scenarios/serving/presets_v4_flash_sm90.yaml --out "$O/presets"
  ;;
esac
