"""The discovery chain for library backends (backends/toolchains/library.py) with fake sources, fake
packages and fake library files: the order of the sources, an explicit file winning, the
kernels folder's newest build, what a not-found reason names, and listing every build."""

from __future__ import annotations

import lzma
import sys
import tarfile

import pytest

from dsv4bench.backends import deepgemm, fa3, flashmla
from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.toolchains import library
from dsv4bench.backends.toolchains.library import Absent, Build, LibrarySpec, Source


def _source(label: str, found=None, error: Exception | None = None, kind: str = "package"):
    """A source holding the build `found` (None: nothing), or failing with `error`; loading a
    build returns ("loaded", label, path)."""

    def locate():
        if error is not None:
            raise error
        return [] if found is None else [Build(kind, label, found)]

    return Source(kind, label, locate, lambda b: ("loaded", b.label, b.path))


def _spec(*sources, **kw) -> LibrarySpec:
    kw.setdefault("load_file", lambda path: ("file", path))
    return LibrarySpec("Fake", "Fake not found", sources=sources, **kw)


@pytest.fixture
def kernels(monkeypatch, tmp_path):
    """An empty checkout (tmp_path) whose kernels folder the chain searches."""
    monkeypatch.setattr(library, "CHECKOUT", tmp_path)
    (tmp_path / ".kernels").mkdir()
    return tmp_path / ".kernels"


def test_the_first_source_that_loads_wins_and_failures_are_named(kernels):
    spec = _spec(
        _source("absent"),
        _source("broken", error=ImportError("undefined symbol")),
        _source("good", found="/x/good"),
        _source("later", found="/x/later"),
    )
    assert library.discover(spec) == ("loaded", "good", "/x/good")
    with pytest.raises(Unsupported) as e:
        library.discover(_spec(_source("absent"), _source("broken", error=OSError("bad ABI"))))
    assert str(e.value) == "Fake not found (broken: OSError: bad ABI)"


def test_an_absent_note_joins_the_reason_and_strict_stops_at_a_failure(kernels):
    with pytest.raises(Unsupported, match=r"^Fake not found \(mod: no module named mod\)$"):
        library.discover(_spec(_source("mod", error=Absent("mod: no module named mod"))))
    strict = _spec(_source("broken", error=ImportError("ABI")), _source("good", found="/g"))
    strict = LibrarySpec(**{**strict.__dict__, "strict": True})
    with pytest.raises(Unsupported, match=r"^Fake not found: ImportError: ABI$"):
        library.discover(strict)


def test_a_problem_is_clipped_to_one_short_line(kernels):
    spec = _spec(_source("broken", error=OSError("x" * 1000)))
    with pytest.raises(Unsupported) as e:
        library.discover(spec)
    assert len(str(e.value)) == len("Fake not found ()") + library.PROBLEM_CHARS


def test_an_explicit_file_wins_and_its_failure_is_the_answer(kernels, monkeypatch):
    spec = _spec(_source("good", found="/x/good"), env_var="FAKE_LIB")
    assert library.discover(spec, "/my/lib.so") == ("file", "/my/lib.so")
    monkeypatch.setenv("FAKE_LIB", "/env/lib.so")
    assert library.discover(spec) == ("file", "/env/lib.so")
    assert library.discover(spec, "/my/lib.so") == ("file", "/my/lib.so")  # the option first

    def refuse(path):
        raise Unsupported(f"cannot load {path}")

    refusing = LibrarySpec(**{**spec.__dict__, "load_file": refuse})
    with pytest.raises(Unsupported, match="cannot load /env/lib.so"):  # no fallback
        library.discover(refusing)


def test_the_kernels_folder_gives_its_newest_build_after_every_source(kernels):
    for build in ("fake-1.9.0", "fake-1.10.0", "fake-2.0.0"):
        (kernels / build).mkdir()
        (kernels / build / "lib.so").write_bytes(b"")
    spec = _spec(_source("absent"), kernels=(".kernels/fake-*/lib.so",))
    found = library.kernel_builds(spec)
    assert [b.label for b in found] == ["fake-2.0.0", "fake-1.9.0", "fake-1.10.0"]  # lexical
    assert found[0] == Build("kernels", "fake-2.0.0", str(kernels / "fake-2.0.0" / "lib.so"),
                             "fake-2.0.0")  # fmt: skip
    assert library.discover(spec) == ("file", str(kernels / "fake-2.0.0" / "lib.so"))
    with_package = _spec(_source("pkg", found="/p"), kernels=(".kernels/fake-*/lib.so",))
    assert library.discover(with_package) == ("loaded", "pkg", "/p")


def test_the_first_kernels_glob_that_matches_wins(kernels):
    (kernels / "fake-1").mkdir()
    (kernels / "fake-1" / "lib.so.xz").write_bytes(b"")
    spec = _spec(kernels=(".kernels/fake-*/lib.so", ".kernels/fake-*/lib.so.xz"))
    assert library.kernel_builds(spec)[0].path.endswith("lib.so.xz")
    (kernels / "fake-0").mkdir()
    (kernels / "fake-0" / "lib.so").write_bytes(b"")
    assert [b.path.endswith("fake-0/lib.so") for b in library.kernel_builds(spec)] == [True]


def test_find_builds_lists_every_build_in_the_chains_order(kernels, monkeypatch):
    for build in ("fake-a", "fake-b"):
        (kernels / build).mkdir()
        (kernels / build / "lib.so").write_bytes(b"")
    spec = _spec(
        _source("pkg", found="/site/pkg"),
        _source("broken", error=ImportError("no")),
        _source("engine", found="/site/engine/lib.so", kind="engine"),
        env_var="FAKE_LIB",
        kernels=(".kernels/fake-*/lib.so",),
    )
    monkeypatch.setenv("FAKE_LIB", "/env/lib.so")
    builds = library.find_builds(spec)
    assert [(b.source, b.label) for b in builds] == [
        ("file", "FAKE_LIB"),
        ("package", "pkg"),
        ("engine", "engine"),
        ("kernels", "fake-b"),
        ("kernels", "fake-a"),
    ]
    assert builds[0].path == "/env/lib.so"
    # each build loads on its own: what an instance pinned to one build does
    assert [library.load_build(spec, b) for b in builds[1:4]] == [
        ("loaded", "pkg", "/site/pkg"),
        ("loaded", "engine", "/site/engine/lib.so"),
        ("file", str(kernels / "fake-b" / "lib.so")),
    ]
    with pytest.raises(Unsupported, match="no source 'other'"):
        library.load_build(spec, Build("package", "other", "/x"))


def test_package_and_engine_sources_locate_without_importing(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_kernels_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    engine = tmp_path / "fake_engine"
    (engine / "ops").mkdir(parents=True)
    (engine / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (engine / "ops" / "_fake_C.abi3.so").write_bytes(b"")
    bare = tmp_path / "bare_engine"
    bare.mkdir()
    (bare / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    load = lambda b: b
    (found,) = library.package_source("fake-kernels", "fake_kernels_pkg", load).locate()
    assert (found.source, found.path, found.version) == ("package", str(pkg / "__init__.py"),
                                                         "unknown")  # fmt: skip
    assert library.package_source("x", "no_such_pkg_here", load).locate() == []
    src = library.engine_source("fake", "fake_engine", "ops", "_fake_C*.so", load)
    (found,) = src.locate()
    assert found.path == str(engine / "ops" / "_fake_C.abi3.so")
    assert found.version == "fake_engine unknown"
    with pytest.raises(Unsupported, match="bare_engine unknown ships no ops/_fake_C"):
        library.engine_source("bare", "bare_engine", "ops", "_fake_C*.so", load).locate()
    assert library.engine_source("x", "no_such_engine", "", "*.so", load).locate() == []
    assert "fake_kernels_pkg" not in sys.modules and "fake_engine" not in sys.modules


def test_a_library_file_missing_or_not_loadable_is_one_line(tmp_path):
    args = ("Fake", "_fake_C.so", "fake.lib", "FAKE_LIB")
    with pytest.raises(Unsupported, match=r"^Fake library not found: .*nowhere.so \(from "):
        library.load_op_library(str(tmp_path / "nowhere.so"), *args)
    with pytest.raises(Unsupported, match=f"not found: {tmp_path / '_fake_C.so'}"):
        library.load_op_library(str(tmp_path), *args)  # a folder: its file of that name
    bad = tmp_path / "_fake_C.so"
    bad.write_bytes(b"not a library" * 100)
    with pytest.raises(Unsupported, match=f"^cannot load Fake library {bad}: ") as e:
        library.load_op_library(str(tmp_path), *args)
    assert len(str(e.value)) <= library.REASON_CHARS


def test_a_file_provider_names_its_folder_and_digest(tmp_path):
    (tmp_path / "fake-1.0").mkdir()
    so = tmp_path / "fake-1.0" / "lib.so"
    so.write_bytes(b"abc")
    prov = library.file_provider(so)
    sha = "ba7816bf8f01"  # sha256("abc")
    assert (prov.name, prov.version, prov.location) == (
        "library file",
        f"fake-1.0 sha256:{sha}",
        str(so),
    )


def test_packed_files_unpack_once_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(library, "UNPACK_DIR", tmp_path / "unpacked")
    folder = tmp_path / ".kernels" / "fake-1.0"
    folder.mkdir(parents=True)
    with lzma.open(folder / "lib.so.xz", "wb") as f:
        f.write(b"payload")
    so = library.unpack_xz(folder / "lib.so.xz")
    assert so == tmp_path / "unpacked" / "fake-1.0" / "lib.so" and so.read_bytes() == b"payload"
    so.write_bytes(b"kept")  # once: an unpacked file is not unpacked again
    assert library.unpack_xz(folder / "lib.so.xz").read_bytes() == b"kept"
    (tmp_path / "src" / "mod").mkdir(parents=True)
    (tmp_path / "src" / "mod" / "__init__.py").write_text("X = 1\n")
    packed = tmp_path / ".kernels" / "fake-mod-1.0.tar.xz"
    with tarfile.open(packed, "w:xz") as tar:
        tar.add(tmp_path / "src" / "mod", arcname="mod")
    dest = library.unpack_tar(packed, "mod/__init__.py")
    assert dest == tmp_path / "unpacked" / "fake-mod-1.0"
    assert (dest / "mod" / "__init__.py").read_text() == "X = 1\n"
    assert library.kernel_builds(_spec(kernels=("x",)), tmp_path) == []


def test_the_shipped_library_backends_describe_their_chain():
    assert [s.label for s in flashmla.LIBRARY.sources] == ["flash_mla", "vllm", "sgl-kernel"]
    assert [s.kind for s in flashmla.LIBRARY.sources] == ["package", "engine", "package"]
    assert [s.label for s in fa3.LIBRARY.sources] == ["vllm", "sgl-kernel"]
    assert fa3.LIBRARY.kernels == (fa3.DEFAULT_GLOB, fa3.DEFAULT_GLOB + ".xz")
    assert (flashmla.LIBRARY.env_var, fa3.LIBRARY.env_var) == (flashmla.ENV_LIB, fa3.ENV_LIB)
    assert [s.label for s in deepgemm.LIBRARY.sources] == [
        "deep_gemm",
        "vllm.third_party.deep_gemm",
    ]
    assert deepgemm.LIBRARY.strict
    assert deepgemm.LIBRARY.kernels == (".kernels/deepgemm-vllm-*/deep_gemm", deepgemm.PACKED_GLOB)
