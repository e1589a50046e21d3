"""flashinfer-bench dsa_paged definitions and their workloads -> a scenario of this suite.

Their sparse attention (op dsa_paged, dsa_sparse_attention_*: num_tokens queries, each over
`topk` slots of a bf16 paged cache of ckv + kpe dims) becomes V3.2 decode cases: one request a
query token, the cache in this suite's FP8 record layout (the format the engines' kernels read;
theirs is the dequantized bf16 form of it). The softmax scale is the model's (1/sqrt(576), what
the engines pass); theirs (sm_scale, 1/sqrt(192)) is a scenario field no case has. Their top-k
indexer (dsa_topk_indexer_*: 64 FP8 heads of dim 128, a paged FP8 key cache) becomes
`indexer` cases.
Each workload gives one case: its axes fix the sizes; its tensors are not read, the suite makes
its own from the case seed (cases/inputs.py), so the oracle and every backend see the same."""

from __future__ import annotations

from pathlib import Path

OPS = {"dsa_sparse_attention": "decode", "dsa_topk_indexer": "indexer"}


class ImportError_(ValueError):
    """A definition this importer cannot map (unknown family, other dims)."""


def family_of(name: str) -> str:
    for prefix in OPS:
        if name.startswith(prefix):
            return prefix
    raise ImportError_(
        f"definition {name}: not a DSA definition this suite maps "
        f"(known: {', '.join(p + '_*' for p in OPS)})"
    )


def scenario(root: Path, backends: list[str], name: str | None = None) -> dict:
    """The scenario (YAML data) of every DSA definition under `root` (their TraceSet folder)."""
    from flashinfer_bench.data import TraceSet

    traces = TraceSet.from_path(str(root))
    if not traces.definitions:
        raise ImportError_(f"{root}: no definitions/*.json")
    cases = []
    for definition in traces.definitions.values():
        family_of(definition.name)
        workloads = [t.workload for t in traces.workloads.get(definition.name, [])]
        if not workloads:
            raise ImportError_(f"definition {definition.name}: no workloads under workloads/")
        cases += [case_entry(definition, w.axes) for w in workloads]
    return {
        "name": name or f"flashinfer-bench-{root.resolve().name}",
        "description": "flashinfer-bench definitions "
        + ", ".join(traces.definitions)
        + " (dsv4bench import flashinfer-bench)",
        "arch": ["cpu", "sm90", "sm100", "sm120"],
        "backends": backends,
        "seed": 0,
        "tags": ["flashinfer-bench"],
        "cases": cases,
    }


def case_entry(definition, axes: dict[str, int]) -> dict:
    """One scenario `cases` entry of a definition's workload."""
    const = definition.const_axes
    fam = family_of(definition.name)
    if fam == "dsa_sparse_attention":
        d_qk = const["head_dim_ckv"] + const["head_dim_kpe"]
        if d_qk != 576:
            raise ImportError_(f"definition {definition.name}: q/k dim {d_qk}, V3.2 has 576")
        tokens, pages = _need(definition, axes, "num_tokens", "num_pages")
        page = const["page_size"]
        # their cache is one pool of num_pages pages for all tokens: a request's share of it
        context = max(const["topk"], pages // max(tokens, 1) * page)
        return {
            "op": "decode",
            "model": "v3.2",
            "num_heads": const["num_qo_heads"],
            "topk": const["topk"],
            "page_size": page,
            "batch_size": tokens,
            "context_len": context,
            "tags": [definition.name],
        }
    batch, max_pages = _need(definition, axes, "batch_size", "max_num_pages")
    if (const["num_index_heads"], const["index_head_dim"]) != (64, 128):
        raise ImportError_(f"definition {definition.name}: the V3.2 indexer has 64 heads of 128")
    return {
        "op": "indexer",
        "model": "v3.2",
        "num_heads": const["num_index_heads"],
        "topk": const["topk"],
        "page_size": const["page_size"],
        "batch_size": batch,
        "context_len": max(const["topk"], max_pages * const["page_size"]),
        "tags": [definition.name],
    }


def _need(definition, axes: dict, *names: str) -> list[int]:
    missing = [n for n in names if n not in axes]
    if missing:
        raise ImportError_(f"definition {definition.name}: a workload lacks axes {missing}")
    return [int(axes[n]) for n in names]
