"""dsv4bench/backends/ADD_BACKEND.md's worked example, as the page gives it: its two files
written into a scratch family folder, registered with the page's one line in the shipped
table, found through library.py's chain in a kernels folder, and judged against the oracle
on a topk case. A page whose example no longer runs fails here."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

import dsv4bench.backends
from dsv4bench import backends
from dsv4bench.backends import registry
from dsv4bench.cases import inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import judge
from dsv4bench.measure.topk import compare_forms
from tests.factories import load_scenario

PAGE = Path(dsv4bench.backends.__file__).parent / "ADD_BACKEND.md"
KERNEL = """\
import torch
from engine.utils import is_hip


def fast_topk(logits, lengths, k):
    assert not is_hip()
    cols = torch.arange(logits.shape[1], device=logits.device)
    masked = logits.masked_fill(cols >= lengths[:, None], float("-inf"))
    values, idx = masked.topk(k, dim=1)
    return torch.where(torch.isfinite(values), idx, -1).to(torch.int32)
"""


def _blocks() -> tuple[dict[str, str], list[str]]:
    """The page's files (a python block opening with `# file: PATH`) and its other blocks."""
    files, others = {}, []
    for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S):
        first, _, rest = block.partition("\n")
        if first.startswith("# file: "):
            files[first.removeprefix("# file: ")] = rest
        else:
            others.append(block.strip())
    return files, others


def test_the_worked_example_is_three_files_at_most_and_one_registration_line():
    files, others = _blocks()
    assert len(files) <= 3 and all(p.startswith("backends/") for p in files)
    assert others == ['"enginetopk": EngineTopK,']


def test_the_worked_example_registers_and_matches_the_oracle(
    tmp_path, monkeypatch, backends_as_they_were
):
    files, (line,) = _blocks()
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(
        dsv4bench.backends, "__path__", [*backends.__path__, str(tmp_path / "backends")]
    )
    # the scratch family, importable only now (so no `from ... import` line names it)
    EngineTopK = importlib.import_module("dsv4bench.backends.enginetopk.backend").EngineTopK  # noqa: N806

    shipped = registry._shipped
    table = eval("{" + line + "}", {"EngineTopK": EngineTopK})  # the page's one line
    monkeypatch.setattr(registry, "_shipped", lambda: {**shipped(), **table})
    monkeypatch.setattr(registry, "_loaded_builtin", False)
    backends._REGISTRY.clear()
    kernels = tmp_path / "kernels"
    (kernels / "enginetopk-0.1").mkdir(parents=True)
    (kernels / "enginetopk-0.1" / "topk.py").write_text(KERNEL)
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(kernels))
    monkeypatch.delenv("DSV4BENCH_ENGINETOPK_LIB", raising=False)

    backend = backends.get("enginetopk")
    assert backend.provider().version == "enginetopk-0.1"  # the kernels folder's build
    scenario = load_scenario(
        """\
        name: t
        op: topk
        backends: [enginetopk]
        cases:
          - model: v3.2
            batch_size: 2
            s_q: 2
            context_len: 256
            topk: 32
            form: plain
        """,
        known_backends=backends.names(),
    )
    for case in scenario.cases:
        assert backend.supports(case, "cpu") is None
        x = inputs.make_inputs(case, "cpu")
        prepared = backend.prepare(case, x, "cpu")
        acc = compare_forms(case, x, oracle_call(case, x)(), prepared.finish(prepared.run()))
        assert judge.verdict(acc, case.tolerance) == ("ok", ""), acc
        assert acc["topk_matched"] == 1.0
    for name in ("dsv4bench.backends.enginetopk", "dsv4bench.backends.enginetopk.backend"):
        sys.modules.pop(name, None)
    sys.modules.pop("dsv4bench_enginetopk", None)


def test_prepare_checks_its_reason_before_the_case_is_made():
    from dsv4bench.backends.base import Backend, Prepared, Unsupported

    made = []

    class Picky(Backend):
        name = "picky"

        def prepare_reason(self, case, device):
            return "too big" if case == "big" else None

        def prepare_case(self, case, inputs, device):
            made.append(case)
            return Prepared(run=lambda: None)

    with pytest.raises(Unsupported, match="too big"):
        Picky().prepare("big", {}, "cpu")
    assert made == [] and Picky().prepare("small", {}, "cpu").run() is None and made == ["small"]
