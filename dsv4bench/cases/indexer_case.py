"""What an `indexer` Case means (reference/indexer.py has the math).

An indexer case scores query rows against the key entries of one layer's indexer cache:
  tokens == 0  the paged form (decode): batch_size requests of s_q (= next_n) query tokens each,
               the last s_q positions of a context_len-token sequence, over a paged FP8 key
               cache (page_size-token blocks); V4 rows see (pos + 1) // 4 compressed entries
               (per-row, 2-D context lengths), V3.2 rows the causal prefix (1-D).
  tokens > 0   the ragged form (a prefill chunk): the last `tokens` positions of the sequence,
               keys contiguous, ks = 0 and ke = the keys each row sees.
Keys: context_len // compress_ratio entries (compress_ratio 0 = every token). num_heads are
the indexer's heads; the head dim is the model's indexer head dim (128); topk its top-k.
"""

from __future__ import annotations

from dsv4bench.cases.case import Case
from reference.indexer import INDEXERS, SCALE_BYTES

DEFAULT_HEAD_DIM = 128
FP32, BF16 = 4, 2


def head_dim(case: Case) -> int:
    cfg = INDEXERS.get(case.model)
    return cfg.head_dim if cfg else DEFAULT_HEAD_DIM


def ratio(case: Case) -> int:
    return case.compress_ratio or 1


def keys(case: Case) -> int:
    """Key entries of the whole sequence: the logits' width (max_model_len / N)."""
    return case.context_len // ratio(case)


def rows(case: Case) -> int:
    return case.tokens if case.tokens else case.batch_size * case.s_q


def visible_total(case: Case) -> int:
    """Sum over query rows of the keys each row sees (DeepGEMM's cost count)."""
    r = ratio(case)
    n = case.tokens or case.s_q
    first = case.context_len - n
    total = sum((first + j + 1) // r for j in range(n))
    return total * (1 if case.tokens else case.batch_size)


def logits_bytes(case: Case) -> int:
    """The fp32 logits matrix a call returns: rows x keys x 4 bytes."""
    return rows(case) * keys(case) * FP32


def flops(case: Case) -> int:
    """2 * visible (row, key) pairs * heads * head_dim, as DeepGEMM's tests count."""
    return 2 * visible_total(case) * case.num_heads * head_dim(case)


def bytes_moved(case: Case) -> int:
    """At least: e4m3 q, fp32 weights, each request's keys once (D e4m3 + fp32 scale), logits."""
    d, h = head_dim(case), case.num_heads
    requests = 1 if case.tokens else case.batch_size
    return (
        rows(case) * h * (d + FP32) + requests * keys(case) * (d + SCALE_BYTES) + logits_bytes(case)
    )


def defaults(model) -> dict:
    """An indexer case's axis defaults from a scenario model (scenarios.rules.ModelSpec)."""
    cfg = INDEXERS.get(model.name)
    c4 = model.compress_ratio == 4
    return {
        "num_heads": cfg.heads if cfg else model.num_heads,
        "topk": cfg.topk if cfg else (model.index_topk or model.topk),
        "page_size": 64,
        "window": 0,
        "compress_ratio": 4 if c4 else 0,
        "extra_topk": 0,
        "sink": False,
    }
