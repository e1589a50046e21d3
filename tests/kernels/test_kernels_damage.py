"""The kernels folder's traps: a file with other bytes of the same size, an archive that is cut,
empty, not xz or whose files differ from its build.json, a tampered build.json (in `kernels
list`, `pack`, `backends`), a build.json name that would extract outside the folder. Each is one
line and exit 2 (or one line of `list`), and nothing is written outside the kernels folder."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from dsv4bench.cli import main
from dsv4bench.kernels.store import Build, KernelFile, read_builds, sha256_of, verify, write_build

NAME = "fa3-vllm-0.33.0"
DATA = b"fa3" * 1000


def _build(root: Path, name: str = NAME, data: bytes = DATA) -> Build:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "lib.so").write_bytes(data)
    file = KernelFile("lib.so", "vllm/lib.so", sha256_of(folder / "lib.so"), len(data))
    build = Build(name, "fa3", "vllm", "0.33.0", "", [file])
    write_build(root, build)
    return build


def _one_line(capsys, says: str) -> None:
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_verify_checks_the_bytes_not_only_the_size(tmp_path, capsys):
    build = _build(tmp_path)
    assert verify(tmp_path, build) == []
    (tmp_path / NAME / "lib.so").write_bytes(b"xyz" * 1000)  # same size, other bytes
    assert verify(tmp_path, build) == [f"{NAME}/lib.so: sha256 or size differs from build.json"]
    assert main(["kernels", "list", "--dir", str(tmp_path)]) == 0
    assert "damaged: " in capsys.readouterr().out


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _build_json(name: str = NAME, data: bytes = DATA) -> bytes:
    import hashlib

    file = {"path": "lib.so", "member": "m", "sha256": hashlib.sha256(data).hexdigest()}
    build = {"name": name, "library": "fa3", "package": "vllm", "version": "0.33.0"}
    build |= {"library_version": "", "files": [{**file, "size": len(data)}], "wheels": []}
    return json.dumps(build).encode()


def _members(data: bytes, build_json: bytes | None = None, folder: str = NAME) -> dict:
    return {f"{folder}/build.json": build_json or _build_json(), f"{folder}/lib.so": data}


def test_unpack_checks_what_it_extracted(tmp_path, capsys):
    good = _archive(tmp_path / "good.tar.xz", _members(DATA))
    assert main(["kernels", "unpack", str(good), "--dir", str(tmp_path / "k")]) == 0
    other = b"xyz" * 1000  # same size as build.json says, other bytes
    bad = _archive(tmp_path / "bad.tar.xz", _members(other))
    there = tmp_path / "there"
    assert main(["kernels", "unpack", str(bad), "--dir", str(there)]) == 2
    _one_line(capsys, "sha256 or size differs")
    assert not (there / NAME).exists() and read_builds(there) == []


def _cut(tmp_path: Path) -> Path:
    data = bytes(range(256)) * 400
    whole = _archive(tmp_path / "whole.tar.xz", _members(data, _build_json(data=data)))
    cut = tmp_path / "cut.tar.xz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    return cut


@pytest.mark.parametrize("make", ["cut", "empty", "gzip", "text"])
def test_unpack_of_an_archive_that_does_not_read_is_one_line(tmp_path, capsys, make):
    if make == "cut":
        archive = _cut(tmp_path)
    else:
        archive = tmp_path / f"{make}.tar.xz"
        if make == "gzip":
            with tarfile.open(archive, "w:gz") as tar:
                tar.add(__file__, arcname=f"{NAME}/build.json")
        else:
            archive.write_bytes(b"" if make == "empty" else b"not an archive\n")
    root = tmp_path / "k"
    assert main(["kernels", "unpack", str(archive), "--dir", str(root)]) == 2
    _one_line(capsys, str(archive))
    assert [p.name for p in root.iterdir()] == []  # no partial folder left behind


def test_a_build_json_name_outside_the_folder_is_refused_before_extracting(tmp_path, capsys):
    root = tmp_path / "a" / "b" / "k"
    evil = _archive(tmp_path / "evil.tar.xz", _members(DATA, _build_json("../../.."), "x"))
    before = sorted(tmp_path.rglob("*"))
    assert main(["kernels", "unpack", str(evil), "--dir", str(root)]) == 2
    _one_line(capsys, "name: expected one folder name")
    made = [p for p in tmp_path.rglob("*") if p not in before and p != root]
    assert [p for p in made if root not in p.parents] == [tmp_path / "a", tmp_path / "a" / "b"]
    assert list(root.iterdir()) == []


TAMPERED = [
    ("not json", b"{", "not JSON"),
    ("size a string", _build_json().replace(b'"size": 3000', b'"size": "3000"'), "size: expected"),
    ("a list", b"[1]", "expected an object"),
    ("no name", _build_json().replace(b'"name"', b'"nom"'), "missing name"),
    ("path out", _build_json().replace(b'"lib.so"', b'"../../x"'), "path: expected"),
]


@pytest.mark.parametrize(("what", "text", "says"), TAMPERED, ids=[t[0] for t in TAMPERED])
def test_a_tampered_build_json_is_one_line(tmp_path, capsys, what, text, says):
    _build(tmp_path / "k")
    (tmp_path / "k" / NAME / "build.json").write_bytes(text)
    assert main(["kernels", "list", "--dir", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(NAME) and says in out and "damaged" in out
    for argv in (["kernels", "pack"], ["kernels", "pack", NAME]):
        assert main([*argv, "--dir", str(tmp_path / "k"), "--out", str(tmp_path / "p")]) == 2
        _one_line(capsys, says)
    assert not list((tmp_path / "p").glob("*.tar.xz")) if (tmp_path / "p").exists() else True


def test_backends_says_a_tampered_build_json_in_its_row(tmp_path, run_cli):
    _build(tmp_path)
    tampered = _build_json().replace(b'"size": 3000', b'"size": -1')
    (tmp_path / NAME / "build.json").write_bytes(tampered)
    code, out, err = run_cli("backends", "--backend-opt", f"fa3.lib={tmp_path / NAME}")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("fa3 "))
    assert "not available" in row and "size: expected a byte count" in row
