"""Backend options and instances; Prepared.reads (a kernel judged on the inputs it reads)."""

from __future__ import annotations

import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4bench import backends
from dsv4bench.backends import Backend, OptionError, Prepared
from dsv4bench.cases.case import Case, Timing
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.rows.results import read_rows
from dsv4bench.run.worker import Cache, check
from dsv4bench.scenarios import ScenarioError, load_text

PLUGIN = "tests.plugins.misbehaving"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    backends.setup([PLUGIN])  # then each test's instances are undone
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    monkeypatch.setattr(backends, "_CONFIGURED", {})


def tiny(**kw) -> Case:
    return Case(
        scenario="options-test",
        op="decode",
        model="v3.2",
        d_qk=576,
        d_v=512,
        num_heads=4,
        batch_size=1,
        topk=64,
        context_len=128,
        page_size=64,
        layout="v32",
        scale_convention="pow2",
        timing=Timing(warmup=0, iters=1, timeout_s=20),
        **kw,
    )


def test_two_instances_of_one_backend_side_by_side():
    e4m3 = backends.configure("flashinfer", {"kv_dtype": "e4m3"}, "flashinfer-e4m3")
    assert backends.get("flashinfer").kv_dtype == "bf16"
    assert e4m3.kv_dtype == "e4m3" and e4m3.name == "flashinfer-e4m3"
    assert e4m3.base == "flashinfer"
    assert e4m3.option_values() == {"kv_dtype": "e4m3", "past_planner_limit": False, "lib": None}
    assert backends.configured() == [
        {
            "name": "flashinfer-e4m3",
            "base": "flashinfer",
            "options": {"kv_dtype": "e4m3", "past_planner_limit": False, "lib": None},
        }
    ]


def test_command_line_options_are_typed_and_inherited_by_instances():
    backends.apply_options(["flashmla.lib=/x/lib.so", "wrong.factor=1.5"])
    assert backends.get("flashmla").lib == "/x/lib.so"
    assert backends.get("wrong").factor == 1.5  # text -> the default's type
    other = backends.configure("flashmla", {}, "flashmla-b")
    assert other.lib == "/x/lib.so"


@pytest.mark.parametrize(
    "text, message",
    [
        ("flashmla.lib", "expected BACKEND.OPTION=VALUE"),
        ("nope.x=1", "unknown backend 'nope'"),
        (
            "flashmla.libb=x",
            "flashmla: unknown option 'libb' (options: lib, batch_invariant, small_heads)",
        ),
        ("flashinfer.kv_dtype=fp16", "kv_dtype must be one of"),
        ("wrong.factor=big", "wrong.factor: expected float, got 'big'"),
        ("torch.x=1", "torch: unknown option 'x' (options: none)"),
    ],
)
def test_bad_options_are_one_line(text, message):
    with pytest.raises(OptionError, match=re.escape(message)) as e:
        backends.apply_options([text])
    assert "\n" not in str(e.value)


def test_an_instance_name_cannot_be_redefined():
    backends.configure("wrong", {"factor": 2.0}, "wrong-2")
    backends.configure("wrong", {"factor": 2.0}, "wrong-2")  # the same again is fine
    with pytest.raises(OptionError, match="already defined with other options"):
        backends.configure("wrong", {"factor": 3.0}, "wrong-2")
    with pytest.raises(OptionError, match="already exists"):
        backends.configure("wrong", {"factor": 3.0}, "slowed")


SCENARIO = """
name: opts
op: decode
model: v3.2
backends: [wrong, {name: wrong, as: right, factor: 1.0}, {name: flashinfer, kv_dtype: e4m3}]
defaults: {batch_size: 1, context_len: 128, topk: 64, num_heads: 4}
"""


def test_scenario_backend_entries_define_instances():
    sc = load_text(SCENARIO, "o.yaml", known_backends=backends.catalog())
    assert sc.backends == ["wrong", "right", "flashinfer[kv_dtype=e4m3]"]
    assert [(i["name"], i["base"], i["options"]) for i in sc.instances] == [
        ("right", "wrong", {"factor": 1.0}),
        ("flashinfer[kv_dtype=e4m3]", "flashinfer", {"kv_dtype": "e4m3"}),
    ]
    assert sc.instances[0]["origin"] == "o.yaml:5"


@pytest.mark.parametrize(
    "entry, message",
    [
        ("[{name: wrong, factr: 1.0}]", "o.yaml:5: backends[0].factr: unknown key; did you mean"),
        ("[{as: x}]", "o.yaml:5: backends[0].name: required key missing"),
        ("[{name: wrong, factor: [1, 2]}]", "o.yaml:5: backends[0].factor: expected a single"),
        ("[wrong, {name: wrong}, wrong]", "o.yaml:5: backends[1]: backend 'wrong' listed twice"),
    ],
)
def test_bad_scenario_entries_name_file_line_and_key(entry, message):
    text = SCENARIO.replace(SCENARIO.splitlines()[4].split(": ", 1)[1], entry)
    with pytest.raises(ScenarioError) as e:
        load_text(text, "o.yaml", known_backends=backends.catalog())
    assert str(e.value).startswith(message), str(e.value)


class Requantized(Backend):
    """A kernel that reads a coarser copy of q: its answer is right for what it reads."""

    name = "requantized"
    archs = ("cpu",)
    ops = ("decode",)
    options = {"declare_reads": True}

    def __init__(self, declare_reads: bool = True):
        self.declare_reads = declare_reads

    def prepare(self, case, inputs, device):
        reads = {**inputs, "q": (inputs["q"] * 1.05).to(inputs["q"].dtype)}
        return Prepared(run=oracle_call(case, reads), reads=reads if self.declare_reads else None)


def test_a_converting_kernel_is_judged_on_the_original_cache_its_own_error_beside():
    """What an engine serving the cache gets is the answer against the original inputs: a
    lossy conversion fails the row; the kernel's own error (against what it reads) and the
    conversion's stand beside, and the row says which one it was judged on."""
    case = tiny()
    row, _ = check(case, Requantized(), "cpu", Cache())
    assert row["status"] == "incorrect" and row["message"].startswith("cos_diff")
    assert row["accuracy"]["cos_diff"] > case.tolerance.cos_diff
    assert row["info"]["kernel_own"]["cos_diff"] < 1e-12
    assert row["info"]["conversion"]["cos_diff"] > case.tolerance.cos_diff
    assert row["info"]["judged_on"].startswith("the original cache")
    hidden, _ = check(case, Requantized(declare_reads=False), "cpu", Cache())
    assert hidden["status"] == "incorrect" and "kernel_own" not in hidden["info"]
    assert hidden["accuracy"] == row["accuracy"]  # declaring what it reads changes no verdict


class OffMaxLogits(Backend):
    """A sparse prefill whose out and lse are right and whose max_logits are off by `shift`."""

    name = "off-max-logits"
    archs = ("cpu",)
    ops = ("prefill",)
    options = {"shift": 0.01}

    def __init__(self, shift: float = 0.01):
        self.shift = shift

    def prepare(self, case, inputs, device):
        call = oracle_call(case, inputs)

        def run():
            got = call()
            return replace(got, max_logits=got.max_logits + self.shift)

        return Prepared(run=run)


def test_sparse_prefill_max_logits_are_judged():
    case = replace(tiny(tokens=4, route="sparse-prefill"), op="prefill")
    row, _ = check(case, OffMaxLogits(), "cpu", Cache())
    assert row["status"] == "incorrect", row["accuracy"]
    assert row["message"] == "max_logits_max_abs 0.01 > 0.001"
    assert row["accuracy"]["cos_diff"] < 1e-12 and row["accuracy"]["lse_max_abs"] == 0.0
    fine, _ = check(case, OffMaxLogits(shift=0.0), "cpu", Cache())
    assert fine["status"] == "ok" and fine["accuracy"]["max_logits_max_abs"] == 0.0


def test_a_run_holds_two_instances_side_by_side_and_rows_name_them(tmp_path, run_cli):
    scenario = tmp_path / "o.yaml"
    scenario.write_text(
        textwrap.dedent("""
        name: opts
        op: decode
        model: v3.2
        backends: [wrong, {name: wrong, as: right, factor: 1.0}]
        timing: {warmup: 0, iters: 1}
        defaults: {batch_size: 1, context_len: 128, topk: 64, num_heads: 4}
        """)
    )
    # in this process; the workers, processes of their own, build the same two instances
    args = ["run", scenario, "--out", tmp_path / "run", "--plugin", PLUGIN]
    code, _, err = run_cli(*args, "--backend-opt", "wrong.factor=1.02", "--quiet")
    assert code == 1, err  # the `wrong` instance's row is incorrect
    assert "wrong: incorrect" in err
    rows = {r["backend"]: r for r in read_rows(tmp_path / "run")}
    assert rows["wrong"]["status"] == "incorrect"
    assert rows["wrong"]["backend_options"] == {"factor": 1.02}
    assert rows["right"]["status"] == "ok"
    assert (rows["right"]["backend_base"], rows["right"]["backend_options"]) == (
        "wrong",
        {"factor": 1.0},
    )
    code, _, err = run_cli(*args, "--backend-opt", "wrong.factor=big")
    assert code == 2
    assert err.strip() == "dsv4bench: --backend-opt: wrong.factor: expected float, got 'big'"
