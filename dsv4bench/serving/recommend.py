"""`dsv4bench recommend`: per phase, the fastest correct backend measured on one GPU for a model
and TP size, the engine flags that select it, and the gain over each engine's default (the
presets in serving/presets.py), from the serving rows of run directories."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsv4bench.rows import timers
from dsv4bench.serving import presets as pz

METRICS = {"ttft": "TTFT", "tpot": "TPOT"}


@dataclass
class PhaseAdvice:
    metric: str
    ranking: pz.Ranking
    phase: pz.Phase

    @property
    def best(self) -> tuple[pz.Candidate, float] | None:
        return self.ranking.order[0] if self.ranking.order else None


def advise(rows: list[dict], model: str, tp: int) -> dict[str, PhaseAdvice]:
    out = {}
    for metric in METRICS:
        ph = pz.phase(rows, model, tp, metric)
        if ph.points:
            out[metric] = PhaseAdvice(metric, pz.rank(ph), ph)
    return out


def best_pair(advice: dict[str, PhaseAdvice]) -> tuple[str, float, float] | None:
    """(kv, TTFT sum, TPOT sum) of the fastest KV dtype when one engine keeps one dtype for
    both phases (a relative sum: each phase normalised by its overall best)."""
    if set(advice) != set(METRICS):
        return None
    best = {}
    for kv in pz.ENGINE_KV_DTYPES:
        sums = {}
        for metric, a in advice.items():
            r = pz.rank(a.phase, kv)
            if not r.order or not a.best:
                break
            points = a.ranking.points
            value = pz.value_on(a.phase, r.order[0][0], points)
            if value is None:
                break
            sums[metric] = (r.order[0][0], value, value / a.best[1])
        if len(sums) == len(METRICS):
            best[kv] = sums
    if not best:
        return None
    kv = min(best, key=lambda k: sum(v[2] for v in best[k].values()))
    return kv, best[kv]["ttft"], best[kv]["tpot"]


class NothingToRank(ValueError):
    """No serving rows for the model and TP, rows of several GPUs or runs, or no candidate
    correct at every point of any phase: one line, exit 2. `detail`: the lines that say why
    per candidate (its failed points), printed before the line; empty when there are none."""

    def __init__(self, message: str, detail: list[str] | None = None):
        super().__init__(message)
        self.detail = detail or []


def _gpus(rows: list[dict]) -> list[str]:
    """The GPUs the rows were measured on. A point none of whose parts ran (status `missing`)
    is written with no env: it was measured nowhere and names no GPU."""
    measured = [r["env"] for r in rows if r.get("env")]
    return sorted({str(e.get("gpu") or "unknown GPU") for e in measured}) or ["unknown GPU"]


def _arch(rows: list[dict]) -> str:
    return next((str(r["env"]["arch"]) for r in rows if (r.get("env") or {}).get("arch")), "")


def lines(rows: list[dict], model: str, tp: int) -> list[str]:
    """The recommendation as text lines. Raises NothingToRank (one line) when no serving row
    is of this model and TP, or when they come from more than one GPU or run: a ranking pairs
    rows of one run only (times of two runs differ by more than the candidates may), and which
    run's row of a point wins would depend on the argument order."""
    serving = [r for r in rows if r.get("kind") == "serving"]
    mine = [r for r in serving if r.get("model") == model and (r.get("tp") or 1) == tp]
    gpus = _gpus(mine)
    if len(gpus) > 1:
        raise NothingToRank(
            f"serving rows of {model} at TP {tp} from {len(gpus)} GPUs ({', '.join(gpus)}): "
            "recommend ranks one GPU's runs at a time"
        )
    runs = sorted({str(r["_run"]) for r in mine if r.get("_run") is not None})
    if len(runs) > 1:
        raise NothingToRank(
            f"serving rows of {model} at TP {tp} from {len(runs)} runs ({', '.join(runs)}): "
            "recommend pairs the rows of one run; pass one run directory per call"
        )
    advice = advise(mine, model, tp)
    if not advice:
        have = sorted({(r.get("model"), r.get("tp") or 1) for r in serving})
        shown = ", ".join(f"{m} TP {t}" for m, t in have) or "none"
        raise NothingToRank(f"no serving rows for {model} at TP {tp} (serving rows: {shown})")
    gpu, arch = gpus[0], _arch(mine)
    timed = sorted({timers.point_timer(r) for r in mine if r.get("value_ms") is not None})
    out = [
        f"{model}, TP {tp}, on {gpu} ({arch}): sparse-attention part of TTFT/TPOT, measured"
        + (f" (kernel times by {' and '.join(timed)})" if timed else "")
    ]
    caveats = Caveats(rows)
    for metric, a in advice.items():
        out += _phase_lines(metric, a, model, arch, caveats)
    if all(a.best is None for a in advice.values()):
        phases = " or ".join(METRICS[m] for m in advice)
        raise NothingToRank(
            f"nothing to rank for {model} at TP {tp}: no correct candidate in {phases} (each "
            "was incorrect at a point or ran none ok; listed above)",
            detail=out,
        )
    pair = best_pair(advice)
    if pair:
        kv, ttft, tpot = pair
        out.append(
            f"one KV dtype for both phases: {kv} — TTFT {ttft[0].label()}, TPOT {tpot[0].label()}"
        )
    return out


def _phase_lines(metric: str, a: PhaseAdvice, model: str, arch: str, caveats: Caveats) -> list[str]:
    name = METRICS[metric]
    n, of = len(a.ranking.points), len(a.phase.points)
    if a.best is None:
        why = "; ".join(f"{c.label()}: {w}" for c, w in a.ranking.left_out.items()) or "no rows"
        return [f"{name}: no correct backend ({why})", *_failed_lines(a.phase)]
    cand, total = a.best
    over = f"{n} points" if n == of else f"the {n} of {of} points every ranked candidate ran ok"
    caveat = caveats.of(cand.backend)
    fastest = (
        f"fastest {cand.label()} (correct at these points only" if caveat else "fastest correct"
    )
    out = [
        f"{name}: {fastest} {cand.label()}, {total:.3f} ms summed over {over}"
        if not caveat
        else f"{name}: {fastest}), {total:.3f} ms summed over {over}",
        *([f"  {caveat}"] if caveat else []),
        f"  flags: {pz.flags_for(cand, metric, model)}",
    ]
    for c, value in a.ranking.order[1:]:
        line = f"  then {c.label()}: {value:.3f} ms (x{value / total:.2f} the fastest's time)"
        out.append(line + caveats.suffix(c.backend))
    for c, why in sorted(a.ranking.left_out.items(), key=lambda t: t[0].label()):
        out.append(f"  not ranked: {c.label()}: {why}")
    for p in pz.presets_for(model):
        line = _preset_line(p, metric, a, total, arch)
        out.append(line + caveats.suffix(pz.preset_candidate(p, metric).backend))
    return out + _failed_lines(a.phase)


class Caveats:
    """Where a backend is `incorrect` on a case of the runs given (values, shapes): a
    candidate correct at every serving point may still be wrong on other inputs, and a
    recommendation says so beside it. A case counts once, by its last row."""

    def __init__(self, rows: list[dict]):
        last: dict[tuple, dict] = {}
        for r in rows:
            if r.get("kind") == "case" and r.get("backend"):
                last[(r.get("_run"), r["case_id"], r["backend"])] = r
        self.cases = list(last.values())

    def _mine(self, backend: str) -> list[dict]:
        return [r for r in self.cases if backend in (r["backend"], r.get("backend_base"))]

    def of(self, backend: str) -> str:
        """'incorrect on N of M BACKEND cases of these runs: WHERE', or '' if on none."""
        mine = self._mine(backend)
        bad = [r for r in mine if r.get("status") == "incorrect"]
        if not bad:
            return ""
        where: dict[str, set[str]] = {}
        for r in bad:
            p = r.get("params") or {}
            values = f"values {p.get('values') or 'normal'}"
            where.setdefault(values, set()).add(_shape(r))
        said = "; ".join(f"{v} at {', '.join(sorted(s))}" for v, s in sorted(where.items()))
        return f"incorrect on {len(bad)} of {len(mine)} {backend} cases of these runs: {said}"

    def suffix(self, backend: str) -> str:
        caveat = self.of(backend)
        return f" [{caveat}]" if caveat else ""


def _shape(row: dict) -> str:
    p = row.get("params") or {}
    size = f"t{p['tokens']}" if p.get("tokens") else f"b{p.get('batch_size')}"
    return f"{row.get('op')} {p.get('model')} h{p.get('num_heads')} {size}"


def _preset_line(p: pz.Preset, metric: str, a: PhaseAdvice, total: float, arch: str) -> str:
    cand = pz.preset_candidate(p, metric)
    if arch and p.arch != arch:
        return (
            f"  {p.name} default ({p.engine_label()}: {cand.label()}): for {p.gpu} ({p.arch}), "
            f"not {arch}"
        )
    head = f"  {p.name} default ({p.engine_label()}: {cand.label()}, {p.gpu}):"
    failed = pz.failures(a.phase, cand)
    value = pz.value_on(a.phase, cand, a.ranking.points)
    if value is None:
        return f"{head} {failed or 'not measured here'}" + (" (below)" if failed else "")
    gain = value / total
    verdict = "the fastest" if gain < 1.005 else f"x{gain:.2f} the fastest's time"
    if failed:
        return f"{head} {failed} (below); {value:.3f} ms at the ranked points, {verdict}"
    return f"{head} {value:.3f} ms, {verdict}"


def _failed_lines(ph: pz.Phase) -> list[str]:
    """Every point a candidate did not run ok, and why (the row's status and message)."""
    out = []
    for cand, points in sorted(ph.failed.items(), key=lambda t: t[0].label()):
        out.append(f"  failed, {cand.label()}: {pz.failures(ph, cand)}:")
        for key in sorted(points, key=lambda k: tuple(x or 0 for x in k)):
            status, message = points[key]
            why = _one_line(message, status)
            out.append(f"    {_point(ph.metric, key)}: {status}" + (f": {why}" if why else ""))
    return out


def _point(metric: str, key: tuple) -> str:
    if metric == "ttft":
        return f"prompt {key[0]}, chunk {key[1]}"
    return f"batch {key[0]}, context {key[1]}"


def _one_line(message: str, status: str, limit: int = 120) -> str:
    """A failure's telling part: its first line less the `CASE on BACKEND: STATUS: ` prefix
    a row's message starts with, cut to `limit`."""
    first = next((ln.strip() for ln in (message or "").splitlines() if ln.strip()), "")
    first = re.sub(r"^\S+ on \S+: ", "", first)
    first = first.removeprefix(f"{status}: ")
    return first if len(first) <= limit else first[: limit - 1] + "…"
