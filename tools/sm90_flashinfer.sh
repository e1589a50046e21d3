#!/usr/bin/env bash
# The command behind results/sm90/flashinfer-fa3/: FlashInfer's FA3 MLA (sm90) against FlashMLA
# on an H100 without a package registry. Run from the repository root with the wheels in .whl/
# (../shared/tools/flashinfer-wheels.sh .whl) and FlashMLA's op library in .kernels/
# (../shared/tools/prebuilt-flashmla.sh .kernels).
#   1. install flashinfer-python + apache-tvm-ffi into /tmp/site (no index, no deps)
#   2. the backend comparison scenario (scenarios/compare/backends_sm90.yaml) -> $DEST/run/results.jsonl;
#      the first plan() of each FlashInfer variant JIT-compiles (info.compile_s of that row)
#   3. the GPU tests of the FA3 path (real kernel vs oracle, and vs the CPU fake)
# The report is built afterwards anywhere: python3 -m dsv4bench.cli report $DEST/run
set -uo pipefail
dest=${DEST:-results/sm90/flashinfer-fa3}
lib=${DSV4BENCH_FLASHMLA_LIB:-.kernels/flashmla-vllm-0.26.0}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-jit}
mkdir -p "$dest/run"
log() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__)"
log "scenario"
python3 -m dsv4bench.cli run scenarios/compare/backends_sm90.yaml --arch sm90 --flashmla-lib "$lib" \
  --out "$dest/run" 2>&1 | tee "$dest/run.log"
log "gpu tests"
python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/backends/test_flashinfer_fa3.py 2>&1 | tee "$dest/gpu-tests.txt"
log "done"
