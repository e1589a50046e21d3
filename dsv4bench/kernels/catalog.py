"""What each engine package ships that the backends run: which members of its wheel make which
kernel build. One entry per package; adding a release is adding a version to `versions`.

A release the catalog has not seen is fetched all the same: a build's members are found in the
wheel by what they are (a Finder: file-name patterns, the ops a shared object registers, the
functions a Python entry point defines), and `versions` lists the releases the adapters were
tested against (a build of another is planned as an "untested release"; whether it runs is
decided at load, from its op schemas and signatures).

A build is named `<library>-<source>-<version>` (`flashmla-vllm-0.33.0`), or `<library>-<version>`
when the library is the package's own (`flashinfer-0.7.2.post1`, `tilelang-runtime-0.1.15`): the
name of its folder in the kernels folder and of the backend instance that runs it."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """Members of another package's wheel that a build needs beside its own (headers, a
    runtime): `requirement` names the wheel, `members`/`strip` pick as BuildSpec's do (none:
    the whole wheel), and they land under `under` in the build's folder."""

    requirement: str
    members: tuple[str, ...] = ()
    strip: str = ""
    under: str = ""


@dataclass(frozen=True)
class Finder:
    """How a build's members are recognised in any release's wheel, by what they are.

    `anchor`: a glob of the member that locates the build (`*/_*fa3_C*.so`); it must carry
    every string of `registers` (ops a shared object registers, as its TORCH_LIBRARY schema
    text; functions a Python file defines), so that a file merely named alike is not taken.
    `take`: globs, relative to the anchor's folder, of the members taken (`**` every member
    under it). `keep_folder`: the members land under the anchor folder's own name
    (`deep_gemm/...`), else directly in the build's folder."""

    anchor: str
    registers: tuple[str, ...] = ()
    take: tuple[str, ...] = ("**",)
    keep_folder: bool = False


@dataclass(frozen=True)
class BuildSpec:
    """One kernel library inside a package's wheel.

    `members`: wheel paths (a trailing `/` takes the whole folder) and `strip`: the prefix cut off
    each, so `vllm/third_party/deep_gemm/x` lands as `<build>/deep_gemm/x`."""

    library: str  # flashmla, fa3, deepgemm, flashinfer, q8kv8
    members: tuple[str, ...]
    strip: str = ""
    whole_wheel: bool = False  # unpack every member (a site folder for PYTHONPATH)
    under: str = ""  # the folder of the build its own members land in
    parts: tuple[Part, ...] = ()  # members of other wheels it needs
    # a whole-wheel build's wheels: the package's and its extra wheels ("both"), or one side
    # ("package", "extras": a build too big for one archive, split in two)
    wheels: str = "both"
    find: Finder | None = None  # members found by what they are (then members/strip unused)


@dataclass(frozen=True)
class PackageSpec:
    dist: str  # the name pip knows
    source: str  # how build names say where a build came from
    # the releases the adapters were tested against, newest first (any other is fetched and
    # planned as an untested release)
    versions: tuple[str, ...]
    builds: tuple[BuildSpec, ...]
    extra_wheels: tuple[str, ...] = ()  # requirements unpacked beside it (whole wheels)
    # a wheel for another Python or glibc than the GPU machine's (members taken: source only)
    python_version: str = ""
    platforms: tuple[str, ...] = ()  # accepted besides fetch.PLATFORMS
    # releases the shipped scenarios name but the adapters were not tested against yet (their
    # builds are backend instances before they are fetched; planned as untested releases)
    untested: tuple[str, ...] = ()

    def build_name(self, build: BuildSpec, version: str) -> str:
        if build.library == self.source or build.library.startswith(f"{self.source}-"):
            return f"{build.library}-{version}"
        return f"{build.library}-{self.source}-{version}"


# FlashMLA: vLLM's flashmla libraries, beside the one that registers the sparse ops
FLASHMLA_OPS = ("sparse_decode_fwd(", "sparse_prefill_fwd(")
FIND_FLASHMLA = Finder("*_flashmla_C*.so", FLASHMLA_OPS, ("*flashmla*.so",))
FIND_FA3 = Finder("*_fa3_C*.so", ("fwd(Tensor",), ("*_fa3_C*.so", "flash_attn_interface.py"))
# DeepGEMM: the deep_gemm package whose entry point has the paged indexer (any build's name)
FIND_DEEPGEMM = Finder("*deep_gemm/__init__.py", ("paged_mqa_logits",), keep_folder=True)
VLLM = PackageSpec(
    dist="vllm",
    source="vllm",
    versions=("0.33.0", "0.26.0"),
    untested=("0.34.0",),
    builds=(
        BuildSpec("flashmla", (), find=FIND_FLASHMLA),
        BuildSpec("fa3", (), find=FIND_FA3),
        BuildSpec("deepgemm", (), find=FIND_DEEPGEMM),
    ),
)
SGL_FLASH_MLA = PackageSpec(
    dist="sgl-flash-mla",
    source="sgl",
    versions=("1.0.0",),
    builds=(BuildSpec("flashmla", ("flash_mla/",)),),
)
FLASHINFER = PackageSpec(
    dist="flashinfer-python",
    source="flashinfer",
    versions=("0.7.2.post1", "0.6.18"),
    untested=("0.7.4",),
    builds=(BuildSpec("flashinfer", (), whole_wheel=True),),
    extra_wheels=("apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0",),
)

# sglang's JIT sources of the SM90 FP8 x FP8 sparse prefill kernel, built by nvcc on the GPU
# machine (dsv4bench/backends/q8kv8/jit.py) against CUTLASS (FlashInfer 0.6.18's copy: the
# sglang wheel carries none) and apache-tvm-ffi (its C ABI, headers and libtvm_ffi; the
# version the kernel was verified with on an H100). sglang ships CPython 3.11 wheels only.
Q8KV8_CSRC = "sglang/kernels/jit/csrc/sparse_mla_q8kv8_prefill_sm90/"
# sglang's JIT top-k kernels (dsv4bench/backends/sgl_topk): their two sources, the header-only
# sgl_kernel library they include, and apache-tvm-ffi, built by nvcc on the GPU machine; the
# folders land as csrc/ and include/ as in sglang's own jit/ folder.
SGL_TOPK_JIT = "sglang/kernels/jit/"
SGL_TOPK_SOURCES = ("csrc/elementwise/fast_topk.cuh", "csrc/deepseek_v4/topk_v2.cuh")
# TileLang, the compiler sglang's `tilelang` DSA kernels run on; its requirements are a build of
# their own, so that each archive can travel in a GPU call of its own (docs/kernel-facts.md,
# TileLang: 28.3 MiB and 9.1 MiB packed)
TILELANG = PackageSpec(
    dist="tilelang",
    source="tilelang",
    versions=("0.1.15",),
    builds=(
        BuildSpec("tilelang-runtime", (), whole_wheel=True, wheels="package"),
        BuildSpec("tilelang-deps", (), whole_wheel=True, wheels="extras"),
    ),
    extra_wheels=(  # its METADATA's Requires-Dist beyond torch and numpy
        "z3-solver>=4.13.0,<4.15.5",
        "apache-tvm-ffi>=0.1.11,<0.1.13",
        "torch-c-dlpack-ext",
        "cloudpickle",
        "ml-dtypes",
        "psutil",
        "tqdm>=4.62.3",
    ),
)
# sglang's Triton sparse MLA kernels (dsv4bench/backends/sglang_triton/): the sm120 V4 decode,
# the dsv4 fused decode package, the V3.2 DSA decode and prefill, and metadata.py they import
SGLANG_ATTENTION = "sglang/kernels/ops/attention/"
SGLANG_TRITON_DSV4 = "dsv4/triton_sparse_decode"  # a package: its __init__ imports a sibling
SGLANG_TRITON = (  # relative to SGLANG_ATTENTION, and to the build's folder
    "flash_mla_sm120.py",
    "flash_mla_sm120_triton.py",
    "metadata.py",
    "dsa/triton_sparse_mla.py",
    "dsa/triton_sparse_mla_decode.py",
    "dsa/triton_sparse_mla_prefill.py",
    f"{SGLANG_TRITON_DSV4}/__init__.py",
    f"{SGLANG_TRITON_DSV4}/triton_mla_kernels_decode_optimized.py",
    f"{SGLANG_TRITON_DSV4}/triton_mla_kernels_decode_fused.py",
)
SGLANG_TRITON_FILES = tuple(SGLANG_ATTENTION + f for f in SGLANG_TRITON)
# sglang's helper kernels on the DSA path (dsv4bench/backends/engine_helpers/): the FP8 -> bf16
# dequant of V3.2 and V4/V4.1 caches, the top-k -> page-table remap, the sm120 page split
SGLANG_OPS = (  # relative to SGLANG_ATTENTION, and to the build's folder
    "dsa/dequant_k_cache.py",
    "dsa/transform_index.py",
    "dsv4/dequant_k_cache.py",
    "dsv4/kv_layout.py",
    "flash_mla_sm120.py",
)
SGLANG = PackageSpec(
    dist="sglang",
    source="sglang",
    versions=("0.5.23",),
    builds=(
        BuildSpec(
            "q8kv8",
            (Q8KV8_CSRC,),
            Q8KV8_CSRC,
            under="csrc/",
            parts=(
                Part(
                    "flashinfer-python==0.6.18",
                    ("flashinfer/data/cutlass/include/",),
                    "flashinfer/data/cutlass/",
                    "cutlass/",
                ),
                Part("apache-tvm-ffi==0.1.15.post2", under="site/"),
            ),
        ),
        BuildSpec(
            "tilelang",
            ("sglang/kernels/ops/attention/dsa/tilelang_kernel.py",),
            "sglang/kernels/ops/attention/dsa/",
        ),
        BuildSpec(
            "sglang-topk",
            (*(SGL_TOPK_JIT + f for f in SGL_TOPK_SOURCES), f"{SGL_TOPK_JIT}include/"),
            SGL_TOPK_JIT,
            parts=(Part("apache-tvm-ffi==0.1.15.post2", under="site/"),),
        ),
        BuildSpec("sglang-triton", SGLANG_TRITON_FILES, SGLANG_ATTENTION),
        BuildSpec("sglang-ops", tuple(SGLANG_ATTENTION + f for f in SGLANG_OPS), SGLANG_ATTENTION),
    ),
    python_version="3.11",  # a cp311 wheel on a manylinux_2_34 tag: only plain files taken
    platforms=("manylinux_2_34_x86_64",),
)

# vLLM's helper kernels on the DSA path (dsv4bench/backends/engine_helpers/), from the same
# wheel as VLLM's builds but listed for the releases that ship them: `vllm[ops]` is the vllm
# wheel to pip (a dist without that extra is downloaded as it is). vllm-ops: the `_C` library
# (concat_and_cache_mla, cp_gather_and_upconvert_fp8_kv_cache, the indexer cache ops, the
# top-k ops); vllm-triton: the Triton index remap (sparse_utils.py, landing at mla/) and the
# DeepSeek V4 / V4.1 FP8 cache writers and gathers (cache_utils.py, outside the strip: they land
# at their wheel paths, vllm/models/...).
VLLM_OPS_SO = "vllm/_C_stable_libtorch.abi3.so"
VLLM_MLA = "vllm/v1/attention/backends/"
VLLM_V4_CACHE = "vllm/models/deepseek_v4/common/ops/cache_utils.py"
VLLM_V41_CACHE = "vllm/models/deepseek_v41/common/ops/cache_utils.py"
VLLM_OPS = PackageSpec(
    dist="vllm[ops]",
    source="vllm",
    versions=("0.33.0",),
    builds=(
        BuildSpec("vllm-ops", (VLLM_OPS_SO,), "vllm/"),
        BuildSpec(
            "vllm-triton",
            (VLLM_MLA + "mla/sparse_utils.py", VLLM_V4_CACHE, VLLM_V41_CACHE),
            VLLM_MLA,
        ),
    ),
)

# DeepGEMM as other engines ship it for Hopper: SGLang's fork and TokenSpeed's build
SGL_DEEP_GEMM = PackageSpec(
    dist="sgl-deep-gemm",
    source="sgl",
    versions=(),
    untested=("0.2.5",),
    builds=(BuildSpec("deepgemm", (), find=FIND_DEEPGEMM),),
)
TOKENSPEED_DEEPGEMM = PackageSpec(
    dist="tokenspeed-deepgemm",
    source="tokenspeed",
    versions=(),
    untested=("2.8.2.post20261020",),
    builds=(BuildSpec("deepgemm", (), find=FIND_DEEPGEMM),),
)

PACKAGES = {
    p.dist: p
    for p in (
        VLLM,
        SGL_FLASH_MLA,
        FLASHINFER,
        TILELANG,
        SGLANG,
        VLLM_OPS,
        SGL_DEEP_GEMM,
        TOKENSPEED_DEEPGEMM,
    )
}


class SpecError(ValueError):
    """A package spec the catalog does not know (one line for the user)."""


def parse_spec(spec: str) -> list[tuple[PackageSpec, str]]:
    """`vllm==0.34.0` -> that release, tested or not; `vllm` -> (package, ""): the newest release
    the registry serves (fetch asks it); `all` -> every tested release of every package."""
    if spec == "all":
        return [(p, v) for p in PACKAGES.values() for v in p.versions]
    dist, sep, version = spec.partition("==")
    package = PACKAGES.get(dist.strip())
    if package is None:
        raise SpecError(f"{spec}: unknown package (known: {', '.join(PACKAGES)})")
    version = version.strip()
    if sep and not re.fullmatch(r"[0-9][0-9A-Za-z.+!_-]*", version):
        raise SpecError(f"{spec}: expected {dist}==VERSION (a release such as 1.2.3)")
    return [(package, version)]


def tested(package: str, version: str) -> bool:
    """Whether the adapters were tested against this release (the catalog lists it)."""
    return package in PACKAGES and version in PACKAGES[package].versions


def _named(p: PackageSpec) -> tuple[str, ...]:
    return (*p.versions, *(v for v in getattr(p, "untested", ()) if v not in p.versions))


def known_builds() -> list[tuple[str, str]]:
    """(build name, library) of every build of every release the catalog names (tested, then
    untested), as the catalog lists them."""
    return [
        (p.build_name(b, v), b.library)
        for p in PACKAGES.values()
        for v in _named(p)
        for b in p.builds
    ]


def default_specs() -> list[str]:
    """What `kernels fetch` takes with no spec: every tested release."""
    return [f"{p.dist}=={v}" for p in PACKAGES.values() for v in p.versions]


def fetch_spec(build_name: str) -> str | None:
    """The `kernels fetch` spec that brings a build (`vllm==0.33.0` for `flashmla-vllm-0.33.0`);
    None for a name no release the catalog names ships."""
    for p in PACKAGES.values():
        for v in _named(p):
            if any(p.build_name(b, v) == build_name for b in p.builds):
                return f"{p.dist}=={v}"
    return None


def tested_build(build_name: str) -> bool:
    """Whether a build is of a release the adapters were tested against."""
    spec = fetch_spec(build_name)
    if spec is None:
        return False
    dist, _, version = spec.partition("==")
    return tested(dist, version)
