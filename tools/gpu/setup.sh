# Source at the start of a GPU command (bash): unpacks what tools/gpu/pack.sh carried in
# .kernels/ and exports where each backend finds it. Idempotent; ~20 s the first time.
#   FlashMLA  .kernels/flashmla-vllm-0.26.0          (DSV4BENCH_FLASHMLA_LIB)
#   FA3       /tmp/dsv4-kernels/fa3-vllm-0.26.0/_vllm_fa3_C.abi3.so (DSV4BENCH_FA3_LIB; never into .kernels/:
#             146 MiB would not travel)
#   DeepGEMM  /tmp/dsv4-kernels/deepgemm/deep_gemm   (on PYTHONPATH)
#   FlashInfer + tvm-ffi  /tmp/dsv4-kernels/site     (on PYTHONPATH; JIT cache FLASHINFER_WORKSPACE_BASE)
_k=.kernels
_t=/tmp/dsv4-kernels
mkdir -p "$_t"
for _xz in "$_k"/fa3-vllm-*/_vllm_fa3_C.abi3.so.xz; do
  [ -f "$_xz" ] || continue
  _so="$_t/$(basename "$(dirname "$_xz")")/_vllm_fa3_C.abi3.so"
  mkdir -p "$(dirname "$_so")"
  [ -f "$_so" ] || python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$_xz" "$_so"
  export DSV4BENCH_FA3_LIB=${DSV4BENCH_FA3_LIB:-$_so}
done
for _dg in "$_k"/deepgemm-vllm-*.tar.xz; do
  [ -f "$_dg" ] && [ ! -d "$_t/deepgemm/deep_gemm" ] && mkdir -p "$_t/deepgemm" && tar -xJf "$_dg" -C "$_t/deepgemm"
done
if [ -f "$_k/site.tar.xz" ] && [ ! -d "$_t/site/flashinfer" ]; then
  mkdir -p "$_t/site" && tar -xJf "$_k/site.tar.xz" -C "$_t/site"
fi
export PYTHONPATH=".:$_t/site:$_t/deepgemm${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-jit}
for _lib in "$_k"/flashmla-vllm-0.26.0; do [ -d "$_lib" ] && export DSV4BENCH_FLASHMLA_LIB=${DSV4BENCH_FLASHMLA_LIB:-$_lib}; done
unset _k _t _xz _so _dg _lib
