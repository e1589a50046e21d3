#!/usr/bin/env bash
# Takes the sm90 kernel libraries out of one vLLM wheel, for GPU machines that have torch but
# neither a package registry nor the means to build these kernels:
#   DEST/flashmla-vllm-VER/          _flashmla_C.abi3.so, _flashmla_extension_C.abi3.so (FlashMLA)
#   DEST/fa3-vllm-VER/_vllm_fa3_C.abi3.so.xz   vLLM's FlashAttention-3 build, xz-compressed (the
#                                    backend `fa3` and tools/gpu/setup.sh decompress it)
#   DEST/deepgemm-vllm-VER.tar.xz    vLLM's bundled deep_gemm package (CPython 3.12 extension
#                                    only); unpacked, its folder goes on PYTHONPATH
#   usage: tools/gpu/extract-vllm-kernels.sh DEST [VLLM_VERSION]
# The default version, 0.26.0, is built against torch 2.11 and CUDA 13, the GPU machines' torch.
# Already extracted: nothing is downloaded. Prints DEST.
set -euo pipefail
dest=${1:?usage: extract-vllm-kernels.sh DEST [VLLM_VERSION]}
version=${2:-0.26.0}
flashmla="$dest/flashmla-vllm-$version"
fa3="$dest/fa3-vllm-$version"
deepgemm="$dest/deepgemm-vllm-$version.tar.xz"
if [ -f "$flashmla/_flashmla_C.abi3.so" ] && [ -f "$fa3/_vllm_fa3_C.abi3.so.xz" ] && [ -f "$deepgemm" ]; then
  echo "$dest"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the wheel for the GPU machines' platform, whatever this machine is
python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
  --python-version 3.12 --platform manylinux_2_28_x86_64 --dest "$work" "vllm==$version" >&2
wheel=$(ls "$work"/vllm-*.whl)
mkdir -p "$flashmla" "$fa3"
unzip -q -o -j "$wheel" 'vllm/_flashmla_C.abi3.so' 'vllm/_flashmla_extension_C.abi3.so' -d "$flashmla"
unzip -q -o -j "$wheel" 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' -d "$work/fa3"
xz -T0 -6 --stdout "$work/fa3/_vllm_fa3_C.abi3.so" >"$fa3/_vllm_fa3_C.abi3.so.xz"
unzip -q -o "$wheel" 'vllm/third_party/deep_gemm/*' -d "$work/wheel"
# keep the one extension module the GPU machines' Python loads
find "$work/wheel/vllm/third_party/deep_gemm" -maxdepth 1 -name '_C.cpython-*.so' \
  ! -name '_C.cpython-312-*' -delete
tar -cJf "$deepgemm" -C "$work/wheel/vllm/third_party" deep_gemm
du -sh "$dest"/* >&2
echo "$dest"
