"""A run's rows as the PyTorch OSS benchmark database's v3 records (the oss_ci_benchmark_v3
table of pytorch/test-infra, clickhouse_db_schema/oss_ci_benchmark_v3/schema.sql; vLLM's
dashboards read it): one record a metric of a row. A case row that ran gives `median_ms`
(benchmark_values: its timed samples, else its median) and, where the oracle judged it,
`cos_diff`; a serving point gives `ttft_ms` or `tpot_ms`. The schema's Map(String, String)
fields hold strings only; a field the suite does not know (workflow and job ids, memory) is 0
or "", as the schema's defaults.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from dsv4bench.history.store import Entry, entry_of
from dsv4bench.report.load import is_probe, load_rows

REPO = "dsv4bench"
BENCHMARK = "dsv4bench sparse MLA"


def _strings(d: dict) -> dict[str, str]:
    return {
        str(k): json.dumps(v) if isinstance(v, (dict, list)) else str(v)
        for k, v in d.items()
        if v is not None
    }


def _runner(entry: Entry, env: dict) -> dict:
    gpu = env.get("gpu")
    return {
        "name": entry.host,
        "type": entry.device,
        "cpu_info": str(env.get("cpu") or ""),
        "cpu_count": 0,
        "mem_info": "",
        "avail_mem_in_gb": 0,
        "gpu_info": str(gpu or ""),
        "gpu_count": 1 if gpu else 0,
        "gpu_mem_info": "",
        "avail_gpu_mem_in_gb": 0,
        "extra_info": _strings(
            {"arch": env.get("arch"), "driver": env.get("driver"), "cuda": env.get("cuda")}
        ),
    }


def _common(entry: Entry, env: dict, branch: str) -> dict:
    stamp = int(datetime.fromisoformat(entry.date).timestamp())
    return {
        "timestamp": stamp,
        "schema_version": "v3",
        "name": BENCHMARK,
        "repo": REPO,
        "head_branch": branch,
        "head_sha": entry.commit,
        "workflow_id": 0,
        "run_attempt": 1,
        "job_id": 0,
        "runners": [_runner(entry, env)],
        "dependencies": {
            "torch": {
                "repo": "pytorch/pytorch",
                "branch": "",
                "sha": "",
                "version": str(env.get("torch") or ""),
                "extra_info": {},
            },
            "triton": {
                "repo": "triton-lang/triton",
                "branch": "",
                "sha": "",
                "version": str(env.get("triton") or ""),
                "extra_info": {},
            },
        },
    }


def _metric(name: str, values: list[float], extra: dict) -> dict:
    return {
        "name": name,
        "benchmark_values": [float(v) for v in values],
        "target_value": 0.0,
        "extra_info": _strings(extra),
    }


def case_records(row: dict, common: dict) -> list[dict]:
    """The records of one case row: none unless it ran and was timed or judged."""
    params = row.get("params") or {}
    provider = row.get("provider") or {}
    base = {
        **common,
        "benchmark": {
            "name": BENCHMARK,
            "mode": "inference",
            "dtype": str(params.get("layout") or ""),
            "extra_info": _strings(
                {
                    "op": row.get("op"),
                    "scenario": row.get("scenario"),
                    "case_id": row.get("case_id"),
                }
            ),
        },
        "model": {
            "name": str(params.get("model") or ""),
            "type": f"sparse MLA {row.get('op')}",
            "backend": str(row.get("backend")),
            "origins": [REPO],
            "extra_info": _strings(
                {
                    **params,
                    "build": f"{provider.get('name', '')} {provider.get('version', '')}".strip(),
                }
            ),
        },
        "inputs": {},
    }
    timing = row.get("timing") or {}
    out = []
    if row.get("status") == "ok" and timing.get("median_ms"):
        samples = timing.get("samples_ms") or [timing["median_ms"]]
        extra = {
            "median_ms": timing["median_ms"],
            "p10_ms": timing.get("p10_ms"),
            "p90_ms": timing.get("p90_ms"),
            "method": timing.get("method"),
        }
        out.append({**base, "metric": _metric("median_ms", samples, extra)})
    cos = (row.get("accuracy") or {}).get("cos_diff")
    if cos is not None:
        out.append({**base, "metric": _metric("cos_diff", [cos], {"status": row.get("status")})})
    return out


def serving_records(row: dict, common: dict) -> list[dict]:
    if row.get("status") != "ok" or row.get("value_ms") is None:
        return []
    extra = {
        k: row.get(k)
        for k in (
            "case_id",
            "curve_id",
            "route",
            "batch_size",
            "prompt_len",
            "chunk_size",
            "context_len",
            "tp",
            "timer",
        )
    }
    return [
        {
            **common,
            "benchmark": {
                "name": BENCHMARK,
                "mode": "inference",
                "dtype": "",
                "extra_info": _strings({"scenario": row.get("scenario")}),
            },
            "model": {
                "name": str(row.get("model") or ""),
                "type": "sparse MLA serving",
                "backend": str(row.get("backend")),
                "origins": [REPO],
                "extra_info": {},
            },
            "inputs": {},
            "metric": _metric(f"{row.get('metric')}_ms", [row["value_ms"]], extra),
        }
    ]


def records(run_dir: Path, branch: str = "main") -> list[dict]:
    """Every v3 record of a run directory."""
    entry = entry_of(run_dir)
    rows = load_rows(run_dir)
    env = next((r.get("env") for r in rows if r.get("env")), {}) or {}
    common = _common(entry, env, branch)
    out = []
    for r in rows:
        if r.get("kind") == "case" and not is_probe(r):
            out += case_records(r, common)
        elif r.get("kind") == "serving":
            out += serving_records(r, common)
    return out
