"""How a kernel is obtained, written once for every family: library.py (a prebuilt library or
package), nvcc.py (built by nvcc through tvm-ffi), compiled.py (sources and compiler found
once, each module built once), pyfiles.py (an engine's Python kernel files with stubs)."""
