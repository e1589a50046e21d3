"""The engine issues the failure shapes reproduce, and what is known of their fixes: every row
of a failure-shape case (Case.edge, or a case tagged with an issue's tag) says which issue it
reproduces and whether the build it ran has the fix.

A fix made in the engine (the engine stops making the call) leaves every kernel build as it
was: the row says so. A kernel fix names the first release of each library that has it; a
build's version is compared with it. No fix known: "unknown"."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineIssue:
    tag: str  # the case tag that names it (edge cases carry it implicitly: EDGE_ISSUES)
    issue: str
    symptom: str
    fix: str = ""  # the change that fixes it, "" if none is known
    side: str = ""  # "engine": the engine avoids the call; "kernel": the kernel was changed
    fixed_in: dict[str, str] = field(default_factory=dict)  # library -> first release with it


ISSUES = {
    i.tag: i
    for i in (
        EngineIssue(
            "vllm-51486",
            "vLLM issue 51486 (H100)",
            "flash_mla_sparse_fwd builds its output TMA descriptor from an empty tensor when a "
            "prefill chunk has 0 query tokens: assertion at sm90 prefill phase1.cuh:614",
            "vLLM PR 51489 (open): get_prefill_chunk_plan skips zero-query-len requests",
            "engine",
        ),
        EngineIssue(
            "vllm-56563",
            "vLLM issue 56563 (H100, FLASH_ATTN_MLA_SPARSE)",
            "FA3 sparse MLA asks for TMA descriptors of zero-token segments: 'Failed to "
            "initialize the TMA descriptor 1' every step, output correct",
            "vLLM PR 56591 (open): FlashAttnMLASparseImpl returns early on 0 tokens",
            "engine",
        ),
        EngineIssue(
            "vllm-56771",
            "vLLM issues 56771, 57388",
            "illegal memory access only under CUDA graphs, with padded rows in the batch",
        ),
        EngineIssue(
            "vllm-52339",
            "vLLM issue 52339 (vLLM 0.26.0, H20-3e)",
            "FlashMLA sm90 sparse prefill fails a TMA descriptor assertion (phase1.cuh:614) "
            "near 161K context",
        ),
    )
}
EDGE_ISSUES = {
    "empty-chunk": "vllm-51486",
    "empty-request": "vllm-56563",
    "graph-pad-vllm": "vllm-56771",
    "graph-pad-sglang": "vllm-56771",
}


def issues_of(case) -> list[EngineIssue]:
    tags = [EDGE_ISSUES[case.edge]] if case.edge in EDGE_ISSUES else []
    tags += [t for t in case.tags if t in ISSUES and t not in tags]
    return [ISSUES[t] for t in tags]


def _version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x) for x in m.groups(default="0")) if m else None


def has_fix(issue: EngineIssue, library: str, version: str) -> str:
    """yes / no / unknown, with why, for a build of `library` at `version`."""
    if not issue.fix:
        return "unknown: no fix known"
    if issue.side == "engine":
        return f"no: the fix is in the engine ({issue.fix}); the kernel is called as before"
    first = issue.fixed_in.get(library)
    have, need = _version(version), _version(first or "")
    if have is None or need is None:
        return f"unknown: {issue.fix}; no release of {library} known to have it"
    return ("yes" if have >= need else "no") + f": {issue.fix}, in {library} {first}+"


def note(case, library: str, version: str) -> list[dict]:
    """The row's `engine_issue` entries: the issue, its symptom, and whether this build has
    its fix."""
    return [
        {
            "issue": i.issue,
            "symptom": i.symptom,
            "fix": i.fix or "none known",
            "build_has_fix": has_fix(i, library, version),
        }
        for i in issues_of(case)
    ]


def with_note(info: dict, case, backend, provider: dict | None) -> dict:
    """A row's info with its `engine_issue` entries (rows of cases that reproduce none keep
    theirs). The build is the provider the worker found, else the instance's pinned `lib`
    (a row of a worker that died before answering has no provider)."""
    if not issues_of(case):
        return info
    provider = provider or {}
    library = provider.get("name") or backend.base
    version = provider.get("version") or str(backend.option_values().get("lib") or "")
    return {**(info or {}), "engine_issue": note(case, library, version)}
