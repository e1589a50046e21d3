"""`dsv4bench recommend`: per phase, the fastest correct backend measured on one GPU for a model
and TP size, the engine flags that select it, and the gain over each engine's default (the
presets in serving/presets.py), from the serving rows of run directories."""

from __future__ import annotations

from dataclasses import dataclass

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
    for kv in pz.KV_DTYPES:
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


def _env(rows: list[dict], key: str, default: str) -> str:
    for r in rows:
        env = r.get("env") or {}
        if env.get(key):
            return str(env[key])
    return default


def lines(rows: list[dict], model: str, tp: int) -> list[str]:
    """The recommendation as text lines; a missing model/TP says so in one line."""
    advice = advise(rows, model, tp)
    if not advice:
        have = sorted(
            {(r.get("model"), r.get("tp") or 1) for r in rows if r.get("kind") == "serving"}
        )
        shown = ", ".join(f"{m} TP {t}" for m, t in have) or "none"
        return [f"no serving rows for {model} at TP {tp} (serving rows: {shown})"]
    gpu, arch = _env(rows, "gpu", "unknown GPU"), _env(rows, "arch", "")
    out = [f"{model}, TP {tp}, on {gpu} ({arch}): sparse-attention part of TTFT/TPOT, measured"]
    for metric, a in advice.items():
        out += _phase_lines(metric, a, model, arch)
    pair = best_pair(advice)
    if pair:
        kv, ttft, tpot = pair
        out.append(
            f"one KV dtype for both phases: {kv} — TTFT {ttft[0].label()}, TPOT {tpot[0].label()}"
        )
    return out


def _phase_lines(metric: str, a: PhaseAdvice, model: str, arch: str) -> list[str]:
    name = METRICS[metric]
    n = len(a.ranking.points)
    if a.best is None:
        why = "; ".join(f"{c.label()}: {w}" for c, w in a.ranking.left_out.items()) or "no rows"
        return [f"{name}: no correct backend ({why})"]
    cand, total = a.best
    out = [
        f"{name}: fastest correct {cand.label()}, {total:.3f} ms summed over {n} points",
        f"  flags: {pz.flags_for(cand.backend, metric, model)}",
    ]
    for c, value in a.ranking.order[1:]:
        out.append(f"  then {c.label()}: {value:.3f} ms (x{value / total:.2f})")
    for c, why in sorted(a.ranking.left_out.items(), key=lambda t: t[0].label()):
        out.append(f"  not ranked: {c.label()}: {why}")
    for p in pz.presets_for(model):
        cand_p = pz.preset_candidate(p, metric)
        value = pz.value_on(a.phase, cand_p, a.ranking.points)
        if arch and p.arch != arch:
            out.append(f"  {p.name} default ({cand_p.label()}): for {p.gpu} ({p.arch}), not {arch}")
        elif value is None:
            out.append(f"  {p.name} default ({cand_p.label()}, {p.gpu}): not measured here")
        else:
            gain = value / total
            verdict = "the fastest" if gain < 1.005 else f"x{gain:.2f} the fastest's time"
            out.append(f"  {p.name} default ({cand_p.label()}, {p.gpu}): {value:.3f} ms, {verdict}")
    return out
