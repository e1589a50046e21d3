"""The engine issues the failure shapes reproduce, and what is known of their fixes: every row
of a failure-shape case (Case.edge, or a case tagged with an issue's tag) says which issue it
reproduces, whether the build it ran has the fix, and whether the symptom showed: the row's
message or what the job printed to stderr (info.stderr, run/runner.py) holds one of the
issue's known messages (a symptom can be a line printed beside a correct answer: 56563).

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
    signs: tuple[str, ...] = ()  # text the build prints or raises when the symptom is there


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
            signs=("res == CUresult::CUDA_SUCCESS",),
        ),
        EngineIssue(
            "vllm-56563",
            "vLLM issue 56563 (H100, FLASH_ATTN_MLA_SPARSE)",
            "FA3 sparse MLA asks for TMA descriptors of zero-token segments: 'Failed to "
            "initialize the TMA descriptor 1' every step, output correct",
            "vLLM PR 56591 (open): FlashAttnMLASparseImpl returns early on 0 tokens",
            "engine",
            # CUTLASS's make_tma_copy_desc prints it to std::cerr and goes on
            signs=("Failed to initialize the TMA descriptor",),
        ),
        EngineIssue(
            "vllm-56771",
            "vLLM issues 56771, 57388",
            "illegal memory access only under CUDA graphs, with padded rows in the batch",
            signs=("illegal memory access",),
        ),
        EngineIssue(
            "vllm-52339",
            "vLLM issue 52339 (vLLM 0.26.0, H20-3e)",
            "FlashMLA sm90 sparse prefill fails a TMA descriptor assertion (phase1.cuh:614) "
            "near 161K context",
            signs=("res == CUresult::CUDA_SUCCESS",),
        ),
    )
}
EDGE_ISSUES = {
    "empty-chunk": "vllm-51486",
    "empty-request": "vllm-56563",
    "graph-pad-vllm": "vllm-56771",
    "graph-pad-sglang": "vllm-56771",
    "graph-refill-vllm": "vllm-56771",
    "graph-refill-sglang": "vllm-56771",
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


def symptom_seen(issue: EngineIssue, message: str, stderr: str) -> str:
    """yes / no / unknown, with why: whether the row's message or the job's stderr holds one of
    the issue's known messages."""
    if not issue.signs:
        return "unknown: no message of the symptom known"
    for sign in issue.signs:
        for where, text in (("the row's message", message), ("the job's stderr", stderr)):
            if sign.lower() in (text or "").lower():
                return f"yes: {sign!r} in {where}"
    said = " or ".join(repr(s) for s in issue.signs)
    printed = "the job printed nothing to stderr" if not stderr else "nor in the job's stderr"
    return f"no: {said} not in the row's message, {printed}"


def note(case, library: str, version: str, message: str = "", stderr: str = "") -> list[dict]:
    """The row's `engine_issue` entries: the issue, its symptom, whether this build has its
    fix, and whether the symptom showed in the row's message or the job's stderr."""
    return [
        {
            "issue": i.issue,
            "symptom": i.symptom,
            "fix": i.fix or "none known",
            "build_has_fix": has_fix(i, library, version),
            "symptom_seen": symptom_seen(i, message, stderr),
        }
        for i in issues_of(case)
    ]


def with_note(
    info: dict, case, backend, provider: dict | None, message: str = "", stderr: str = ""
) -> dict:
    """A row's info with its `engine_issue` entries (rows of cases that reproduce none keep
    theirs). The build is the provider the worker found, else the instance's pinned `lib`
    (a row of a worker that died before answering has no provider); the symptom is looked
    for in the row's `message` and the job's `stderr` (all of it: info.stderr is its end)."""
    if not issues_of(case):
        return info
    provider = provider or {}
    library = provider.get("name") or backend.base
    version = provider.get("version") or str(backend.option_values().get("lib") or "")
    stderr = stderr or (info or {}).get("stderr", "")
    notes = note(case, library, version, message, stderr)
    return {**(info or {}), "engine_issue": notes}
