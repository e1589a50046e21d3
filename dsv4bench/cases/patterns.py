"""How a case's drawn top-k sets are picked (the `index_pattern` axis; docs/scenarios.md).

Every pattern returns, per row, k distinct request-local positions in [0, visible), -1 past
the row's visible count, valid entries first (the contract of inputs._query_sets):
  uniform          any visible position, equally likely (what every older case draws)
  recent           weighted towards the end: Gumbel top-k over weights exp(-distance / tau),
                   tau = max(2k, visible / 16) (sampling without replacement by weight)
  clustered        runs of RUN neighbouring positions: the positions are cut into RUN-long
                   segments (at a random shift) and whole segments are drawn
  sorted           uniform picks in ascending order (kernels gather in list order)
  indexer-recency  the lightning indexer's own top-k (reference/indexer.py, FP8 logits) over
  indexer-topic    synthetic keys with structure: a recency signal growing towards the end, or
                   topics in runs (~RUN keys each) of which each request's queries ask for one
The indexer patterns measure locality rather than assume it: what they pick comes from scores.
"""

from __future__ import annotations

import torch

PATTERNS = ("uniform", "recent", "clustered", "sorted", "indexer-recency", "indexer-topic")
RUN = 32  # tokens per cluster (clustered) and mean keys per topic run (indexer-topic)
TOPICS = 16
SELECT_BUDGET = 1 << 26  # elements of random keys alive at once while drawing top-k sets
INDEXER_HEADS, INDEXER_DIM = 64, 128  # V3.2 / V4 indexer heads and head dim


def choose(visible: torch.Tensor, k: int, g, pattern: str = "uniform", req=None) -> torch.Tensor:
    """(rows, k) int64 positions per row; `req` (rows,): each row's request (indexer patterns
    draw one synthetic key sequence per request, shared by its rows)."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown index pattern {pattern!r} (known: {', '.join(PATTERNS)})")
    if pattern == "uniform":
        return _by_score(visible, k, g, _uniform_scores)
    if pattern == "sorted":
        return _ascending(_by_score(visible, k, g, _uniform_scores))
    if pattern == "recent":
        return _by_score(visible, k, g, _recent_scores(k))
    if pattern == "clustered":
        return _by_score(visible, k, g, _cluster_scores)
    req = torch.zeros_like(visible) if req is None else req
    return _indexer_picks(visible, k, g, req, pattern.removeprefix("indexer-"))


def _by_score(visible: torch.Tensor, k: int, g, scores) -> torch.Tensor:
    """Per row the k highest scores among visible positions (scores >= 0), -1 past visible."""
    n = visible.numel()
    out = torch.full((n, k), -1, dtype=torch.int64, device=visible.device)
    width = max(int(visible.max()) if n else 0, k)
    rows = max(1, SELECT_BUDGET // width)
    cols = torch.arange(width, device=visible.device)
    for s in range(0, n, rows):
        v = visible[s : s + rows, None]
        keys = scores(v, width, g).masked_fill(cols >= v, -1.0)  # invisible positions sort last
        top = keys.topk(k, dim=1)
        out[s : s + rows] = top.indices.masked_fill(top.values < 0, -1)
    return out


def _uniform_scores(v: torch.Tensor, width: int, g) -> torch.Tensor:
    return torch.rand(v.shape[0], width, generator=g, device=v.device)


def _recent_scores(k: int):
    def scores(v: torch.Tensor, width: int, g) -> torch.Tensor:
        u = torch.rand(v.shape[0], width, generator=g, device=v.device).clamp_min(1e-12)
        gumbel = -torch.log((-torch.log(u)).clamp_min(1e-30))
        tau = torch.clamp(v.double() / 16, min=2.0 * k).float()
        dist = (v - 1 - torch.arange(width, device=v.device)).clamp_min(0).float()
        return (gumbel - dist / tau).exp()  # >= 0 and order-preserving: _by_score's contract

    return scores


def _cluster_scores(v: torch.Tensor, width: int, g) -> torch.Tensor:
    rows = v.shape[0]
    shift = torch.randint(0, RUN, (rows, 1), generator=g, device=v.device)
    segment = (torch.arange(width, device=v.device) + shift) // RUN
    seg_score = torch.rand(rows, width // RUN + 2, generator=g, device=v.device)
    return seg_score.gather(1, segment)


def _ascending(picks: torch.Tensor) -> torch.Tensor:
    big = torch.iinfo(picks.dtype).max
    ordered = picks.masked_fill(picks < 0, big).sort(dim=1).values
    return ordered.masked_fill(ordered == big, -1)


# ---- the indexer patterns -------------------------------------------------------------------


def _indexer_picks(visible: torch.Tensor, k: int, g, req: torch.Tensor, structure: str):
    """The reference indexer's top-k per row over one synthetic key sequence per request."""
    from reference import indexer

    out = torch.full((visible.numel(), k), -1, dtype=torch.int64, device=visible.device)
    for r in torch.unique(req).tolist():
        rows = (req == r).nonzero().flatten()
        n = max(1, int(visible[rows].max()))
        keys, q, w = synthetic(n, rows.numel(), structure, g, k)
        kv = indexer.split_key_cache(indexer.quantize_key_cache(keys), n)
        ke = visible[rows].to(torch.int32)
        logits = indexer.mqa_logits(q, kv, w, torch.zeros_like(ke), ke)
        out[rows] = indexer.topk_indices(logits, k).long()
    return out


def synthetic(n: int, rows: int, structure: str, g, k: int):
    """Keys (n, D) fp32, queries (rows, H, D) e4m3, weights (rows, H) > 0 with a signal:
    recency (keys carry a direction whose strength grows towards the end) or topic (runs of
    keys share one of TOPICS centroids; the rows ask for one topic)."""
    dev = g.device
    noise = lambda *shape: torch.randn(*shape, generator=g, device=dev)  # noqa: E731
    if structure == "recency":
        u = noise(INDEXER_DIM)
        u = u / u.norm()
        tau = max(2.0 * k, n / 16)
        strength = torch.exp(-(n - 1 - torch.arange(n, device=dev)) / tau)
        keys = 0.5 * noise(n, INDEXER_DIM) + 4.0 * strength[:, None] * u
        direction = u.expand(rows, INDEXER_HEADS, INDEXER_DIM)
    elif structure == "topic":
        centroids = noise(TOPICS, INDEXER_DIM)
        starts = torch.rand(n, generator=g, device=dev) < 1.0 / RUN  # runs of ~RUN keys
        topic_of_run = torch.randint(0, TOPICS, (n,), generator=g, device=dev)
        topic = topic_of_run[torch.cumsum(starts.long(), 0).clamp_max(n - 1)]
        keys = centroids[topic] + 0.5 * noise(n, INDEXER_DIM)
        asked = centroids[torch.randint(0, TOPICS, (1,), generator=g, device=dev)]
        direction = (asked / asked.norm()).expand(rows, INDEXER_HEADS, INDEXER_DIM)
    else:
        raise ValueError(f"unknown indexer key structure {structure!r} (recency, topic)")
    q = (2.0 * direction + 0.3 * noise(rows, INDEXER_HEADS, INDEXER_DIM)).to(torch.float8_e4m3fn)
    w = torch.rand(rows, INDEXER_HEADS, generator=g, device=dev) + 0.5
    return keys, q, w


# ---- locality, measured ---------------------------------------------------------------------


def locality(slots: torch.Tensor, page_size: int) -> dict:
    """How local an index set is, from its global slots (b, s_q, k) or (rows, k); -1 ignored:
    picks per row, distinct pages per row, and the share of picks whose slot + 1 is also
    picked (runs of neighbours). Pages are what a gather reads from DRAM."""
    rows = slots.reshape(-1, slots.shape[-1]).long()
    valid = rows >= 0
    count = valid.sum(1)
    big = torch.iinfo(torch.int64).max
    ordered = rows.masked_fill(~valid, big).sort(dim=1).values
    adjacent = ((ordered[:, 1:] - ordered[:, :-1]) == 1).sum(1)
    pages = torch.where(valid, rows // page_size, big).sort(dim=1).values
    new_page = torch.ones_like(pages, dtype=torch.bool)
    new_page[:, 1:] = pages[:, 1:] != pages[:, :-1]
    distinct = (new_page & (pages != big)).sum(1)
    picks = int(count.sum())
    return {
        "picks_per_row": round(picks / max(1, rows.shape[0]), 2),
        "pages_per_row": round(float(distinct.sum()) / max(1, rows.shape[0]), 2),
        "adjacent": round(float(adjacent.sum()) / max(1, picks), 4),
    }
