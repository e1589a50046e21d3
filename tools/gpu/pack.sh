#!/usr/bin/env bash
# Here (with a registry): fetch every kernel the sm90 backends can use and pack it small enough
# to travel with the checkout (the device tool carries at most 64 MiB in all):
#   .kernels/flashmla-vllm-0.26.0/      FlashMLA (2 MiB)
#   .kernels/fa3-vllm-0.26.0/*.so.xz    vLLM's FlashAttention-3 build (11 MiB of xz)
#   .kernels/deepgemm-vllm-0.26.0.tar.xz  DeepGEMM 2.5.0 (1.5 MiB)
#   .kernels/site.tar.xz                flashinfer-python 0.6.18 + apache-tvm-ffi, unpacked wheels
#                                       as one xz tar (9 MiB; the two wheels are 20 MiB)
# Then carry `.kernels` and begin the GPU command with `source tools/gpu/setup.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/gpu/extract-vllm-kernels.sh .kernels >/dev/null
if [ ! -f .kernels/site.tar.xz ]; then
  # FlashInfer's MLA paths need only these two wheels (its other declared dependencies are
  # optional there); the GPU machine JIT-compiles its kernels with its own nvcc
  pick=(--quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any --dest .whl)
  python3 -m pip download "${pick[@]}" flashinfer-python==0.6.18 >&2
  python3 -m pip download "${pick[@]}" "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for w in .whl/flashinfer_python-*.whl .whl/apache_tvm_ffi-*.whl; do unzip -q -o "$w" -d "$tmp"; done
  tar -cf - -C "$tmp" . | xz -T0 -9 >.kernels/site.tar.xz
fi
du -sh .kernels/* >&2
