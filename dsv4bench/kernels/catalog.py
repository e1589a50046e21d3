"""What each engine package ships that the backends run: which members of its wheel make which
kernel build. One entry per package; adding a release is adding a version to `versions`.

A build is named `<library>-<source>-<version>` (`flashmla-vllm-0.33.0`): the name of its folder
in the kernels folder and of the backend instance that runs it."""

from __future__ import annotations

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


@dataclass(frozen=True)
class PackageSpec:
    dist: str  # the name pip knows
    source: str  # how build names say where a build came from
    versions: tuple[str, ...]  # newest first; the first is fetched when no version is named
    builds: tuple[BuildSpec, ...]
    extra_wheels: tuple[str, ...] = ()  # requirements unpacked beside it (whole wheels)
    # the CPython its wheels exist for, when not the GPU machine's: a build that takes only
    # plain files (sources) from them runs under any Python
    python_version: str | None = None
    wheel_platforms: tuple[str, ...] = ()  # platform tags its wheel may carry beyond fetch's

    def build_name(self, build: BuildSpec, version: str) -> str:
        if self.source == build.library:
            return f"{build.library}-{version}"
        return f"{build.library}-{self.source}-{version}"


VLLM = PackageSpec(
    dist="vllm",
    source="vllm",
    versions=("0.33.0", "0.26.0"),
    builds=(
        BuildSpec(
            "flashmla", ("vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so"), "vllm/"
        ),
        BuildSpec(
            "fa3",
            (
                "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
                "vllm/vllm_flash_attn/flash_attn_interface.py",
            ),
            "vllm/vllm_flash_attn/",
        ),
        BuildSpec("deepgemm", ("vllm/third_party/deep_gemm/",), "vllm/third_party/"),
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
    builds=(BuildSpec("flashinfer", (), whole_wheel=True),),
    extra_wheels=("apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0",),
)

# sglang's JIT sources of the SM90 FP8 x FP8 sparse prefill kernel, built by nvcc on the GPU
# machine (dsv4bench/backends/q8kv8/jit.py) against CUTLASS (FlashInfer 0.6.18's copy: the
# sglang wheel carries none) and apache-tvm-ffi (its C ABI, headers and libtvm_ffi; the
# version the kernel was verified with on an H100). sglang ships CPython 3.11 wheels only.
Q8KV8_CSRC = "sglang/kernels/jit/csrc/sparse_mla_q8kv8_prefill_sm90/"
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
    ),
    python_version="3.11",
    wheel_platforms=("manylinux_2_34_x86_64",),
)

PACKAGES = {p.dist: p for p in (VLLM, SGL_FLASH_MLA, FLASHINFER, SGLANG)}


class SpecError(ValueError):
    """A package spec the catalog does not know (one line for the user)."""


def parse_spec(spec: str) -> list[tuple[PackageSpec, str]]:
    """`vllm==0.33.0` -> that release; `vllm` -> its newest known release; `all` -> every known
    release of every package."""
    if spec == "all":
        return [(p, v) for p in PACKAGES.values() for v in p.versions]
    dist, _, version = spec.partition("==")
    package = PACKAGES.get(dist.strip())
    if package is None:
        raise SpecError(f"{spec}: unknown package (known: {', '.join(PACKAGES)})")
    version = version.strip() or package.versions[0]
    if version not in package.versions:
        raise SpecError(
            f"{spec}: no member list for {dist} {version} "
            f"(known versions: {', '.join(package.versions)})"
        )
    return [(package, version)]


def known_builds() -> list[tuple[str, str]]:
    """(build name, library) of every build of every known release, as the catalog lists them."""
    return [
        (p.build_name(b, v), b.library)
        for p in PACKAGES.values()
        for v in p.versions
        for b in p.builds
    ]


def default_specs() -> list[str]:
    """What `kernels fetch` takes with no spec: every known release."""
    return [f"{p.dist}=={v}" for p in PACKAGES.values() for v in p.versions]
