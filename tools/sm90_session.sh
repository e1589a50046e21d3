#!/usr/bin/env bash
# The GPU runs behind results/sm90/h100-session-*: run on an sm90 machine from the checkout,
# with FlashMLA's vLLM 0.26.0 build in .kernels/ and FlashInfer's wheels in .whl/.
#   tools/sm90_session.sh tests-measure OUT   GPU tests + scenarios/measure/sm90.yaml
#   tools/sm90_session.sh bench OUT           make bench ARCH=sm90 (scenarios/sm90/*.yaml)
#   tools/sm90_session.sh kernels OUT         GPU tests of timing/triton + measure scenario +
#                                             scenarios/sm90/*.yaml on flashmla and triton
set -uo pipefail
what=${1:?tests-measure or bench}
out=${2:?output dir}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
export DSV4BENCH_FLASHMLA_LIB=.kernels/flashmla-vllm-0.26.0
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
case $what in
tests-measure)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rs 2>&1 | tee "$out/gpu-tests.txt"
  timeout 240 python3 -m dsv4bench.cli run scenarios/measure/sm90.yaml --out "$out/measure" \
    2>&1 | tee "$out/measure.log"
  python3 -m dsv4bench.cli report "$out/measure" >/dev/null
  ;;
bench)
  time timeout 540 make bench ARCH=sm90 OUT="$out/bench" 2>&1 | tee "$out/bench.log"
  python3 -m dsv4bench.cli report "$out/bench" >/dev/null
  ;;
kernels)
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_timing.py \
    tests/backends/test_triton_backend.py 2>&1 | tee "$out/gpu-tests.txt"
  timeout 120 python3 -m dsv4bench.cli run scenarios/measure/sm90.yaml --out "$out/measure" \
    2>&1 | tee "$out/measure.log"
  python3 -m dsv4bench.cli report "$out/measure" >/dev/null
  timeout 300 python3 -m dsv4bench.cli run scenarios/sm90/*.yaml --backend flashmla \
    --backend triton --out "$out/kernels" 2>&1 | tee "$out/kernels.log"
  python3 -m dsv4bench.cli report "$out/kernels" >/dev/null
  ;;
esac
