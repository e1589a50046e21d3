"""What tests build: cases, scenarios from YAML text, and the rows a run writes, so that a test
names only the fields it varies.

make_case starts from BASE (a V4-Flash decode at 64 heads; every other field is Case's default),
then applies model shapes (V32, V4) or a test's own dicts in order, then keywords. case_row,
part and serving_row are rows as the worker and serving.aggregate write them, holding the fields
their readers need (a test adds any other as a keyword); write_run puts rows in a run folder.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from dsv4bench.cases.case import Case
from dsv4bench.scenarios import Scenario, load_text

BASE: dict[str, Any] = dict(
    scenario="t", op="decode", model="v4-flash", d_qk=512, d_v=512, num_heads=64
)
# the models' attention shapes with the FP8 cache layout their engines use
V32: dict[str, Any] = dict(model="v3.2", d_qk=576, d_v=512, layout="v32")
V4: dict[str, Any] = dict(model="v4-flash", d_qk=512, d_v=512, layout="v4")

H100_ENV = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "arch": "sm90",
    "driver": "575.57.08",
    "torch": "2.11.0+cu130",
    "triton": "3.5.0",
    "cuda": "13.0",
    "git_commit": "abc123def456",
    "smem_per_block_optin": 232448,
}
CRASH_MSG = "worker exited with code 1: CUDA error: invalid argument (get_decoding_sched_meta.cu)"


def make_case(*shapes: Mapping[str, Any], **fields: Any) -> Case:
    """A Case from BASE, then each of `shapes`, then `fields`: a later value replaces an earlier."""
    merged = dict(BASE)
    for shape in shapes:
        merged.update(shape)
    merged.update(fields)
    return Case(**merged)


def load_scenario(text: str, known_backends: Collection[str], filename: str = "x.yaml") -> Scenario:
    """A kernel scenario from YAML written indented in a test (dedented first); `filename` is
    what its errors name."""
    return load_text(textwrap.dedent(text), filename, known_backends=known_backends)


def case_row(
    case_id: str, backend: str, ms: float | None = None, status: str = "ok", **fields: Any
) -> dict:
    """A case row with the fields serving.aggregate reads: the median time when `ms` is given
    (else no timing), an empty message unless `fields` give one."""
    return {
        "kind": "case",
        "case_id": case_id,
        "backend": backend,
        "status": status,
        "message": "",
        "timing": None if ms is None else {"median_ms": ms},
        **fields,
    }


def part(case_id: str, backend: str, status: str = "ok", role: str = "attention") -> dict:
    """One case of a serving row's parts (21 layers of it)."""
    return {
        "case_id": case_id,
        "multiplicity": 21,
        "role": role,
        "backend": backend,
        "median_ms": 0.05 if status == "ok" else None,
        "status": status,
    }


def serving_row(metric: str, backend: str, value_ms, parts: list[dict], **fields: Any) -> dict:
    """A serving row as serving.aggregate writes it for V4-Flash at 64 heads on an H100; with no
    value, its status and message are the first failing part's."""
    ok = value_ms is not None
    failing = next((p for p in parts if p["status"] != "ok"), None)
    return {
        "kind": "serving",
        "scenario": "serving",
        "model": "v4-flash",
        "metric": metric,
        "backend": backend,
        "num_heads": 64,
        "tp": 1,
        "value_ms": value_ms,
        "breakdown_ms": {"attention": value_ms, "dequant": 0.0, "remap": 0.0} if ok else None,
        "status": "ok" if ok else failing["status"],
        "message": "" if ok else f"{failing['case_id']} on {backend}: crash: {CRASH_MSG}",
        "label": "sparse-attention part of TTFT/TPOT (kernels, dequant, index remap), "
        "without GEMMs, MoE and communication",
        "parts": parts,
        "env": H100_ENV,
        **fields,
    }


def write_run(path: Path, rows: list[dict]) -> Path:
    """A run folder at `path` whose results.jsonl holds `rows`, one JSON line each."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
