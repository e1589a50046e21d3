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
    """The scenario (YAML data) of every DSA definition under `root` (their TraceSet folder).
    Every error names the file (and line) and the field that is wrong."""
    definitions, workloads = _read(root)
    if not definitions:
        raise ImportError_(f"{root}: no definitions/*.json")
    cases = []
    for definition, where in definitions.values():
        family_of(definition.name)
        mine = workloads.get(definition.name, [])
        if not mine:
            raise ImportError_(
                f"{where}: definition {definition.name}: no workloads under workloads/"
            )
        for workload, line in mine:
            entry = case_entry(definition, workload.axes, (where, line))
            cases.append(entry)
    return {
        "name": name or f"flashinfer-bench-{root.resolve().name}",
        "description": "flashinfer-bench definitions "
        + ", ".join(definitions)
        + " (dsv4bench import flashinfer-bench)",
        "arch": ["cpu", "sm90", "sm100", "sm120"],
        "backends": backends,
        "seed": 0,
        "tags": ["flashinfer-bench"],
        "cases": cases,
    }


def _read(root: Path) -> tuple[dict, dict]:
    """(definition name -> (Definition, its file), definition name -> [(Workload, file:line)]),
    each record validated on its own so that an error can say where it is (their TraceSet
    loader names neither the file nor the line)."""
    from flashinfer_bench.data import Definition, Trace

    definitions: dict = {}
    for path in sorted((root / "definitions").rglob("*.json")):
        d = _parsed(Definition, _text(path), str(path))
        if d.name in definitions:
            raise ImportError_(f"{path}: name: {d.name} is defined in {definitions[d.name][1]} too")
        definitions[d.name] = (d, str(path))
    workloads: dict = {}
    for path in sorted((root / "workloads").rglob("*.jsonl")):
        for i, line in enumerate(_text(path).splitlines(), 1):
            if line.strip():
                t = _parsed(Trace, line, f"{path}:{i}")
                workloads.setdefault(t.definition, []).append((t.workload, f"{path}:{i}"))
    return definitions, workloads


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ImportError_(f"{path}: not UTF-8 text (byte {e.start})") from None


def _parsed(model, text: str, where: str):
    """`model` validated from JSON `text`; ImportError_ naming `where` and the field."""
    from pydantic import ValidationError

    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "(the record)"
        raise ImportError_(f"{where}: {field}: {first['msg']}") from None


def case_entry(definition, axes: dict[str, int], where: tuple[str, str] = ("", "")) -> dict:
    """One scenario `cases` entry of a definition's workload; `where`: (the definition's file,
    the workload's file:line), named by errors."""
    const = definition.const_axes
    fam = family_of(definition.name)
    if fam == "dsa_sparse_attention":
        d_qk = const["head_dim_ckv"] + const["head_dim_kpe"]
        if d_qk != 576:
            raise ImportError_(f"definition {definition.name}: q/k dim {d_qk}, V3.2 has 576")
        tokens, pages = _need(definition, axes, where[1], "num_tokens", "num_pages")
        page, topk, heads = _sizes(definition, where[0], "page_size", "topk", "num_qo_heads")
        # their cache is one pool of num_pages pages for all tokens: a request's share of it
        context = max(topk, pages // tokens * page)
        return {
            "op": "decode",
            "model": "v3.2",
            "num_heads": heads,
            "topk": topk,
            "page_size": page,
            "batch_size": tokens,
            "context_len": context,
            "tags": [definition.name],
        }
    batch, max_pages = _need(definition, axes, where[1], "batch_size", "max_num_pages")
    if (const.get("num_index_heads"), const.get("index_head_dim")) != (64, 128):
        raise ImportError_(f"definition {definition.name}: the V3.2 indexer has 64 heads of 128")
    page, topk = _sizes(definition, where[0], "page_size", "topk")
    return {
        "op": "indexer",
        "model": "v3.2",
        "num_heads": const["num_index_heads"],
        "topk": topk,
        "page_size": page,
        "batch_size": batch,
        "context_len": max(topk, max_pages * page),
        "tags": [definition.name],
    }


def _sizes(definition, where: str, *names: str) -> list[int]:
    """The definition's constant axes `names`, each a positive size."""
    const = definition.const_axes
    found = []
    for n in names:
        value = const.get(n)
        if type(value) is not int or value < 1:
            what = "missing" if value is None else f"{value!r}"
            raise ImportError_(
                f"{where or definition.name}: axes.{n}: {what}, expected a positive size"
            )
        found.append(value)
    return found


def _need(definition, axes: dict, where: str, *names: str) -> list[int]:
    missing = [n for n in names if n not in axes]
    if missing:
        raise ImportError_(
            f"{where or definition.name}: workload.axes lacks {', '.join(missing)} "
            f"(definition {definition.name})"
        )
    for n in names:
        if type(axes[n]) is not int or axes[n] < 1:
            raise ImportError_(
                f"{where or definition.name}: workload.axes.{n}: {axes[n]!r}, "
                "expected a positive size"
            )
    return [axes[n] for n in names]
