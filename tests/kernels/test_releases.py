"""A release the catalog never saw, the week it comes out: fetched (members found by what they
are), planned as an untested release, and decided at load by the adapters' schema and signature
checks; `kernels diff` says what changed; `fetch` with no version asks the registry."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dsv4bench.backends import deepgemm
from dsv4bench.cli import main
from dsv4bench.commands.found import kernels_found
from dsv4bench.kernels import catalog, fetch
from dsv4bench.kernels.store import read_builds
from tests.factories import load_scenario

FLASHMLA_SO = (
    b"\x7fELF\x00_ZL44STABLE_TORCH_LIBRARY_static_init__flashmla_C\x00"
    b"sparse_decode_fwd(Tensor q, Tensor kv, Tensor indices, int d_v, float sm_scale) -> Tensor\x00"
    b"sparse_prefill_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v) -> Tensor[]"
    b"\x00"
)
FA3_SO = b"\x00fwd(Tensor! q, Tensor k, Tensor v) -> Tensor[]\x00"
# a pure-Python deep_gemm with DeepGEMM 2.8.1's indexer API (what the adapter reads of it)
DG_INIT = """__version__ = '{version}'
def get_num_sms():
    return 132
def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    pass
def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len{extra}):
    pass
def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k,
                       schedule_meta=None):
    pass
"""


def vllm_wheel(folder: Path, version: str, extra: str = "", decoy: bool = True) -> Path:
    """A vLLM wheel of `version` as fetch meets it: other libraries beside the kernels', a
    file named like FlashMLA's that registers nothing, members where 0.33.0 has them."""
    members = {
        "vllm/_flashmla_C.abi3.so": FLASHMLA_SO,
        "vllm/_flashmla_extension_C.abi3.so": b"\x7fELF ext",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": FA3_SO,
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": FA3_SO.replace(b"fwd", b"fa2"),
        "vllm/vllm_flash_attn/flash_attn_interface.py": b"def flash_attn_varlen_func(q): pass\n",
        "vllm/third_party/deep_gemm/__init__.py": DG_INIT.format(
            version="2.8.1", extra=extra
        ).encode(),
        "vllm/third_party/deep_gemm/include/x.cuh": b"// header\n",
        "vllm/engine.py": b"# not a kernel\n",
    }
    if decoy:  # named like a FlashMLA library, in another folder, registering nothing
        members["vllm/extra/_flashmla_C_old.so"] = b"\x7fELF nothing"
    path = folder / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
    return path


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    root = tmp_path / "k"
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(root))
    return root


def _fetch(root: Path, wheels: Path, spec: str) -> int:
    return main(["kernels", "fetch", spec, "--wheels", str(wheels), "--dir", str(root)])


def _case(text: str):
    return load_scenario(f"name: t\nbackends: [torch]\ncases:\n  - {text}\n", ("torch",)).cases[0]


INDEXER = "{op: indexer, model: v3.2, batch_size: 2}"


def test_an_unseen_release_with_a_known_api_is_fetched_and_planned(tmp_path, kernels, capsys):
    wheels = tmp_path / "w"
    wheels.mkdir()
    vllm_wheel(wheels, "0.99.0")
    assert _fetch(kernels, wheels, "vllm==0.99.0") == 0
    assert "vllm 0.99.0: untested release (tested: 0.33.0, 0.26.0)" in capsys.readouterr().out
    builds = {b.name: b for b in read_builds(kernels)}
    assert sorted(builds) == ["deepgemm-vllm-0.99.0", "fa3-vllm-0.99.0", "flashmla-vllm-0.99.0"]
    flashmla = {f.path for f in builds["flashmla-vllm-0.99.0"].files}
    assert flashmla == {"_flashmla_C.abi3.so", "_flashmla_extension_C.abi3.so"}  # no decoy
    fa3 = {f.path for f in builds["fa3-vllm-0.99.0"].files}
    assert fa3 == {"_vllm_fa3_C.abi3.so", "flash_attn_interface.py"}  # not fa2
    assert (kernels / "deepgemm-vllm-0.99.0/deep_gemm/include/x.cuh").is_file()
    # planned: every fetched build is a backend instance, marked, nothing refused
    from dsv4bench.backends.builds import build_instances
    from dsv4bench.backends.fa3 import FA3
    from dsv4bench.backends.flashmla import FlashMLA

    table = {"flashmla": FlashMLA, "fa3": FA3, "deepgemm": deepgemm.DeepGEMM}
    instances = build_instances(table)
    before = set(sys.modules)
    for name in builds:
        line = kernels_found(instances[name]())
        assert line.startswith(f"build {name}: ") and "[untested release vllm==0.99.0" in line
    assert instances["deepgemm-vllm-0.99.0"]().supports(_case(INDEXER), "sm90") is None
    assert "deep_gemm" not in set(sys.modules) - before  # planned, never loaded here


def _load_in_subprocess(folder: Path) -> str:
    """The DeepGEMM adapter's load verdict on a build (its deep_gemm imported in a process of
    its own: one deep_gemm a process), as check_row writes it into the row."""
    code = (
        "import sys\n"
        "from dsv4bench.backends.deepgemm import DeepGEMM\n"
        "from dsv4bench.run.worker import check_row\n"
        "from tests.factories import load_scenario\n"
        f"text = 'name: t\\nbackends: [torch]\\ncases:\\n  - {INDEXER}\\n'\n"
        "case = load_scenario(text, ('torch',)).cases[0]\n"
        f"b = DeepGEMM(lib={str(folder)!r})\n"
        "row, prepared = check_row(case, b, 'sm90', None)\n"
        "print(row.status, '|', row.message)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_changed_signature_gives_unsupported_rows_naming_the_argument(tmp_path, kernels):
    wheels = tmp_path / "w"
    wheels.mkdir()
    vllm_wheel(wheels, "0.98.0", extra=", page_stride")  # a new required argument
    assert _fetch(kernels, wheels, "vllm==0.98.0") == 0
    verdict = _load_in_subprocess(kernels / "deepgemm-vllm-0.98.0")
    assert verdict.startswith("unsupported | DeepGEMM 2.8.1: fp8_fp4_paged_mqa_logits requires ")
    assert "argument 8 page_stride" in verdict


def test_the_same_api_loads_at_the_adapter(tmp_path, kernels):
    wheels = tmp_path / "w"
    wheels.mkdir()
    vllm_wheel(wheels, "0.99.0")
    assert _fetch(kernels, wheels, "vllm==0.99.0") == 0
    folder = kernels / "deepgemm-vllm-0.99.0"
    code = (
        "from dsv4bench.backends.deepgemm import DeepGEMM\n"
        f"print(DeepGEMM(lib={str(folder)!r}).provider().version)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0 and done.stdout.strip() == "2.8.1", done.stderr[-2000:]


def test_call_reason_names_a_missing_argument():
    class Old:
        __version__ = "3.0"

        @staticmethod
        def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, meta):
            pass

    reason = deepgemm.call_reason(Old, "fp8_fp4_paged_mqa_logits")
    assert reason == (
        "DeepGEMM 3.0: fp8_fp4_paged_mqa_logits takes 6 arguments, the adapter passes 7 "
        "(no argument 7, max_context_len)"
    )


def test_kernels_diff_names_the_changed_argument_in_one_screen(tmp_path, kernels, capsys):
    wheels = tmp_path / "w"
    wheels.mkdir()
    vllm_wheel(wheels, "0.99.0")
    vllm_wheel(wheels, "0.98.0", extra=", page_stride")
    for version in ("0.99.0", "0.98.0"):
        assert _fetch(kernels, wheels, f"vllm=={version}") == 0
    capsys.readouterr()
    diff = ["kernels", "diff", "--dir", str(kernels)]
    assert main([*diff, "flashmla-vllm-0.99.0", "flashmla-vllm-0.98.0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "op schemas (2): same" in out and out[-1].startswith("verdict: unchanged")
    assert main([*diff, "deepgemm-vllm-0.99.0", "deepgemm-vllm-0.98.0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "functions (4 -> 4): 1 changed, 0 added, 0 removed" in out
    assert "  changed deep_gemm:fp8_fp4_paged_mqa_logits: argument 8 added: page_stride" in out
    assert out[-1].startswith("verdict: changed by API") and len(out) <= 25


@pytest.mark.parametrize(
    "args, expected",
    [
        (["flashmla-vllm-0.99.0", "nope"], "kernels diff: nope: no build there"),
        (["flashmla-vllm-0.99.0", "fa3-vllm-0.99.0"], "expected two builds of one library"),
    ],
)
def test_kernels_diff_bad_input_is_one_line_and_exit_2(tmp_path, kernels, capsys, args, expected):
    wheels = tmp_path / "w"
    wheels.mkdir()
    vllm_wheel(wheels, "0.99.0")
    assert _fetch(kernels, wheels, "vllm==0.99.0") == 0
    capsys.readouterr()
    assert main(["kernels", "diff", *args, "--dir", str(kernels)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1


def test_fetch_without_a_version_takes_the_registrys_newest(tmp_path, monkeypatch):
    asked = []

    def pip(cmd, **kw):
        asked.append(cmd)
        out = "vllm (0.99.0)\nAvailable versions: 0.99.0, 0.33.0\n"
        return subprocess.CompletedProcess(cmd, 0, out, "")

    assert fetch.newest_version(catalog.VLLM, "3.12", run=pip) == "0.99.0"
    assert asked[0][3:6] == ["index", "versions", "vllm"]
    assert "--python-version" in asked[0] and "3.12" in asked[0]
    fail = lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: no network")  # noqa: E731
    with pytest.raises(fetch.FetchError, match="pip index versions vllm: ERROR: no network"):
        fetch.newest_version(catalog.VLLM, "3.12", run=fail)
