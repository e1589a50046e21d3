"""The runner survives backends that crash, hang or raise, and writes every row at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4bench import backends
from dsv4bench.cases.case import Case, Timing
from dsv4bench.rows.results import ResultWriter, read_rows
from dsv4bench.run.runner import Job, LimitSearch, Runner
from dsv4bench.run.worker import PARENT_ENV
from tests.factories import V4, V32, make_case

PLUGIN = "tests.plugins.misbehaving"
ROOT = Path(__file__).resolve().parents[2]


TINY = dict(
    V32,
    scenario="runner-test",
    num_heads=4,
    topk=64,
    context_len=128,
    page_size=64,
    scale_convention="pow2",
    timing=Timing(warmup=0, iters=2, timeout_s=20),
)


def tiny(batch_size: int, **kw) -> Case:
    return make_case(TINY, batch_size=batch_size, **kw)


@pytest.fixture(scope="module", autouse=True)
def plugin():
    backends.setup([PLUGIN])


def test_crash_hang_and_error_become_rows_and_the_sweep_goes_on(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    # the SIGKILLed job last: no fresh worker after it, three worker starts in all
    seeds_batches = [(0, 1), (2, 1), (0, 4), (3, 1), (7, 1), (0, 6)]
    jobs = [Job(tiny(b, seed=s), "crashy") for s, b in seeds_batches]
    # the hang is for ever: 2 s tells it from a slow answer as well as any timeout would
    jobs[3] = Job(replace(jobs[3].case, timing=Timing(warmup=0, iters=2, timeout_s=2)), "crashy")
    rows = runner.run(jobs)
    status = [r["status"] for r in rows]
    assert status == ["ok", "error", "crash", "timeout", "ok", "oom"]
    assert "out-of-memory killer" in rows[5]["message"]
    assert "refuses seed 2" in rows[1]["message"]
    crash = rows[2]
    assert "exited with code 1" in crash["message"]
    assert "fatal error at batch 4" in crash["message"]
    # the same worker ran the failing job before: its traceback is not this job's message
    assert "refuses seed 2" not in crash["message"]
    assert "no answer after 2 s" in rows[3]["message"]
    written = read_rows(tmp_path)
    assert [r["status"] for r in written] == status
    assert written[0]["accuracy"]["cos_diff"] < 1e-12
    assert written[0]["timing"]["n"] == 2
    assert written[0]["provider"]["name"] == "crashy"


def test_an_error_row_keeps_the_frame_where_it_was_raised(tmp_path):
    """The worker's traceback ends in the backend's own code (tests/plugins/misbehaving.py's
    prepare, behind several frames of the worker's), not in run/worker.py."""
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    (row,) = runner.run([Job(tiny(1, seed=2), "crashy")])
    assert row["status"] == "error"
    printed = row["info"]["stderr"]
    assert "misbehaving.py" in printed and "in prepare" in printed
    assert 'raise RuntimeError("crashy refuses seed 2")' in printed


def test_the_job_after_an_in_process_cuda_error_gets_a_fresh_worker(tmp_path):
    # the worker answers `crash` and then exits (its CUDA context is poisoned); the next job
    # must not be sent to that exiting process (H200 run: 9 rows "worker exited with code 3")
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    rows = runner.run([Job(tiny(1, seed=5), "crashy"), Job(tiny(1, seed=7), "crashy")])
    assert [r["status"] for r in rows] == ["crash", "ok"]
    assert "illegal memory access" in rows[0]["message"]


def test_what_a_job_printed_to_stderr_is_kept_on_a_correct_row_and_shows_the_symptom(tmp_path):
    # vLLM 56563: FA3 prints "Failed to initialize the TMA descriptor" and answers right
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    case = tiny(3, edge="empty-request")
    rows = runner.run([Job(case, "chatty"), Job(case, "torch"), Job(tiny(1, seed=4), "chatty")])
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    chatty, quiet, plain = rows
    assert chatty["info"]["stderr"].endswith("Failed to initialize the TMA descriptor 1")
    assert len(chatty["info"]["stderr"]) <= 2000
    (note,) = chatty["info"]["engine_issue"]
    assert note["issue"].startswith("vLLM issue 56563")
    assert note["symptom_seen"].startswith("yes: 'Failed to initialize the TMA descriptor'")
    assert "stderr" in note["symptom_seen"]
    # the next job in the same worker printed nothing: none of the last job's output is its
    assert "stderr" not in quiet["info"]
    assert quiet["info"]["engine_issue"][0]["symptom_seen"].startswith("no: ")
    assert "engine_issue" not in plain["info"] and "TMA" in plain["info"]["stderr"]


def test_unsupported_is_recorded_with_its_reason(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    (row,) = runner.run([Job(replace(tiny(1), op="remap"), "crashy")])
    assert row["status"] == "unsupported"
    assert "no remap kernel" in row["message"]


def test_resume_skips_finished_jobs(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    # the first job finishes without a worker (unsupported): one worker start in all
    jobs = [Job(replace(tiny(1), op="remap"), "crashy"), Job(tiny(2), "torch")]
    (first,) = runner.run(jobs[:1])
    assert first["status"] == "unsupported"
    rows = runner.run(jobs, resume=True)
    assert len(rows) == 1 and rows[0]["params"]["batch_size"] == 2
    assert rows[0]["status"] == "ok" and len(read_rows(tmp_path)) == 2


def test_limit_search_finds_the_last_working_batch(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    # crashy dies from batch 4 on, each probe in a fresh process: probes 3, 5, then 4
    search = LimitSearch("batch_size", 3, 5, "crashy", tiny(3))
    row = runner.find_limit(search)
    assert row["kind"] == "limit"
    assert (row["last_ok"], row["first_fail"]) == (3, 4)
    assert row["status"] == "crash"
    assert "fatal error at batch 4" in row["message"]
    probes = [r for r in read_rows(tmp_path) if r["kind"] == "case"]
    assert all("limit-probe" in r["tags"] for r in probes)
    assert json.loads(json.dumps(row))["probes"] == {"3": "ok", "4": "crash", "5": "crash"}


def test_limit_search_with_a_step_stops_at_that_resolution(tmp_path, monkeypatch):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    probed = []

    def fake_job(job, fresh=False, slot=None):
        b = job.case.batch_size
        probed.append(b)
        return {"status": "ok" if b < 4 else "crash", "message": f"batch {b}", "provider": None}

    monkeypatch.setattr(runner, "run_job", fake_job)
    row = runner.find_limit(LimitSearch("batch_size", 1, 9, "crashy", tiny(1), step=2))
    assert probed == [1, 9, 5, 3]  # on lo's grid of step 2, never 4
    assert (row["last_ok"], row["first_fail"], row["step"]) == (3, 5, 2)
    assert row["message"] == "batch 5"


def test_a_listed_probe_inside_the_bracket_is_probed_and_bisected_below(tmp_path, monkeypatch):
    """A failure at one size only (an engine issue's "near 161K", neither end sharing it): lo
    and hi both work, so a plain search would say "no failure"; the listed probe finds it and
    the search bisects below it."""
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    probed = []

    def fake_job(job, fresh=False, slot=None):
        b = job.case.batch_size
        probed.append(b)
        return {"status": "crash" if 40 <= b <= 45 else "ok", "message": f"batch {b}"}

    monkeypatch.setattr(runner, "run_job", fake_job)
    search = LimitSearch("batch_size", 8, 64, "crashy", tiny(8), step=8, probe=(42,))
    row = runner.find_limit(search)
    assert probed[:2] == [8, 42] and 64 not in probed
    assert (row["last_ok"], row["first_fail"], row["status"]) == (32, 40, "crash")  # on the grid
    probed.clear()
    row = runner.find_limit(replace(search, probe=(20,)))
    assert probed == [8, 20, 64] and row["message"] == "no failure up to 64"


def test_a_wrong_answer_ends_a_limit_search_as_a_failure_does(tmp_path, monkeypatch):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)

    def fake_job(job, fresh=False, slot=None):
        b = job.case.batch_size
        return {"status": "ok" if b < 6 else "incorrect", "message": f"cos_diff at {b}"}

    monkeypatch.setattr(runner, "run_job", fake_job)
    row = runner.find_limit(LimitSearch("batch_size", 1, 9, "crashy", tiny(1)))
    assert (row["last_ok"], row["first_fail"], row["status"]) == (5, 6, "incorrect")
    assert row["message"] == "cos_diff at 6"


def test_a_refusal_past_lo_is_where_the_search_ends_not_a_working_value(tmp_path, monkeypatch):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)

    def fake_job(job, fresh=False, slot=None):
        b = job.case.batch_size
        return {"status": "ok" if b < 7 else "unsupported", "message": f"{b} rows > 6"}

    monkeypatch.setattr(runner, "run_job", fake_job)
    row = runner.find_limit(LimitSearch("batch_size", 1, 9, "crashy", tiny(1)))
    assert (row["last_ok"], row["first_fail"], row["status"]) == (6, 7, "unsupported")
    assert row["message"] == "7 rows > 6"


def test_a_search_without_a_kernel_says_unsupported_not_no_failure(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    row = runner.find_limit(LimitSearch("batch_size", 1, 9, "crashy", replace(tiny(1), op="remap")))
    assert (row["last_ok"], row["first_fail"], row["status"]) == (None, None, "unsupported")
    assert "no remap kernel" in row["message"] and row["probes"] == {"1": "unsupported"}


def test_instances_with_their_own_process_key_get_their_own_worker(tmp_path):
    backends.configure("isolated", {"build": "b1"}, "isolated-b1")
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    names = ["isolated", "isolated-b1", "torch"]  # "isolated" shares torch's worker (key "")
    rows = runner.run([Job(tiny(b), name) for b in (1, 2) for name in names])
    assert [r["status"] for r in rows] == ["ok"] * 6
    pid = {(r["params"]["batch_size"], r["backend"]): r["info"].get("pid") for r in rows}
    for name in names[:2]:
        assert pid[(1, name)] == pid[(2, name)]  # a worker per key, kept between cases
    assert pid[(1, "isolated")] != pid[(1, "isolated-b1")]  # a build never shares one
    assert pid[(1, "isolated")] is not None


def test_arch_scale_reading_is_compared_with_its_own_oracle_and_the_exact_one(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    raw = replace(tiny(1), scale_convention="raw")  # vLLM's non-power-of-two scales
    pow2 = tiny(1)
    rows = runner.run([Job(raw, "bf16-scales"), Job(pow2, "bf16-scales")])
    assert [r["status"] for r in rows] == ["ok", "ok"]
    raw_row, pow2_row = rows
    assert raw_row["accuracy"]["cos_diff"] == 0  # against the oracle reading scales as bf16
    assert raw_row["scale_reading"] == "bf16" and raw_row["tolerance"]["cos_diff"] == 5e-6
    assert raw_row["info"]["vs_exact_scales"]["cos_diff"] > 0  # bf16 scales do move it
    assert pow2_row["info"]["vs_exact_scales"]["cos_diff"] == 0  # powers of two survive


def _workers_of(runner_pid: int) -> list[int]:
    """Live processes started as workers of `runner_pid` (they carry its pid in their env)."""
    mark = f"{PARENT_ENV}={runner_pid}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_die_with_their_runner_and_leave_no_log(tmp_path, sig):
    scenario = tmp_path / "hang.yaml"
    scenario.write_text(
        "name: hang\nop: decode\nbackends: [crashy]\nseed: 3\ntiming: {timeout_s: 600}\n"
        "defaults: {model: v3.2, num_heads: 4, topk: 64, context_len: 128}\n"
        "cases: [{batch_size: 1}]\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    hanging = str(tmp_path / "hanging")
    runner = subprocess.Popen(
        [sys.executable, "-m", "dsv4bench.cli", "run", scenario, "--plugin", PLUGIN]
        + ["--out", tmp_path / "run", "--quiet"],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), "CRASHY_HANGING": hanging},
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(hanging) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(runner.pid), runner.stderr.read()
    runner.send_signal(sig)
    runner.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _workers_of(runner.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _workers_of(runner.pid) == []
    assert list(tmp.iterdir()) == []  # no worker log left behind
    if sig == signal.SIGTERM:
        assert runner.returncode == 128 + signal.SIGTERM
        assert b"terminated" in runner.stderr.read()


def test_host_memory_errors_are_oom_and_long_runs_show_hours():
    from dsv4bench.run.runner import _clock
    from dsv4bench.run.worker import _classify

    assert _classify(MemoryError()) == "oom"
    cpu = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 99 bytes"
    assert _classify(RuntimeError(cpu)) == "oom"
    assert _classify(RuntimeError("shape mismatch")) == "error"
    assert _clock(9002 * 60 + 50) == "150:02:50" and _clock(65) == "01:05"


def test_a_long_run_says_so_before_it_starts(tmp_path, capsys, monkeypatch):
    import dsv4bench.run.runner as runner_mod

    monkeypatch.setattr(runner_mod, "LARGE_RUN", 2)
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    runner.run([Job(replace(tiny(1), op="remap"), "crashy")] * 2)  # unsupported: no worker
    assert "2 jobs: a long run" in capsys.readouterr().err


def test_exit_status_failures_exempt_limit_probes_except_wrong_answers():
    from dsv4bench.run.runner import unexpected_failures

    def row(case_id, status, tags=()):
        return {"kind": "case", "case_id": case_id, "backend": "b", "status": status, "tags": tags}

    rows = [
        row("probe-error", "error", ["limit-probe"]),  # a kernel refusing the size: the limit
        row("probe-crash", "crash", ["limit-probe"]),
        row("probe-wrong", "incorrect", ["limit-probe"]),
        row("plain-error", "error"),
        row("tagged-crash", "crash", ["expect-failure"]),
        row("tagged-error", "error", ["expect-failure"]),
    ]
    bad = {r["case_id"] for r in unexpected_failures(rows)}
    assert bad == {"probe-wrong", "plain-error", "tagged-error"}


def test_limit_probes_get_a_worker_started_during_the_previous_probe():
    from dsv4bench.run.devices import Device
    from dsv4bench.run.runner import Slot

    events = []

    class Fake:
        def __init__(self, how):
            self.how, self.ready = how, False
            events.append(("start", how))

        def wait_ready(self):
            self.ready = True

        def alive(self):
            return True

        def stop(self):
            events.append(("stop", self.how))

    n = iter(range(100))
    slot = Slot(
        Device(slot=0), lambda d: Fake(f"blocking-{next(n)}"), lambda d: Fake(f"spare-{next(n)}")
    )
    first = slot.fresh_worker()
    assert first.how == "blocking-0" and events == [("start", "blocking-0"), ("start", "spare-1")]
    second = slot.fresh_worker()  # the spare, started while the first probe ran
    assert second.how == "spare-1" and second.ready and events[-1] == ("start", "spare-2")
    slot.close()
    assert events[-1] == ("stop", "spare-2")  # a spare left at the end is stopped


def test_a_limit_search_runs_each_probe_in_its_own_process(tmp_path):
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    rows = []
    runner._write = lambda r: rows.append(r if isinstance(r, dict) else r.to_dict())
    runner.find_limit(LimitSearch("batch_size", 1, 5, "isolated", tiny(1)))
    pids = [r["info"].get("pid") for r in rows if r["kind"] == "case"]
    assert len(pids) >= 2 and None not in pids and len(set(pids)) == len(pids)


def test_a_reference_row_is_timed_by_events_alone(monkeypatch):
    from dsv4bench.measure import timing
    from dsv4bench.run import worker

    timers, calls = [], []
    monkeypatch.setattr(timing, "measure", lambda fn, **kw: timers.append(kw["timer"]) or {})
    case = replace(tiny(2), timing=replace(tiny(2).timing, timer="both"))
    cache = worker.Cache()
    for name in ("torch", "reference-f64"):
        be = backends.get(name)
        real = be.prepare

        def counted(c, x, d, real=real, name=name):
            p = real(c, x, d)
            run = p.run
            return replace(p, run=lambda: calls.append(name) or run())

        monkeypatch.setattr(be, "prepare", counted)
        row = worker.run_job({"case": case.to_dict(), "backend": name, "arch": "cpu"}, cache)
        assert row["status"] == "ok", row["message"]
    assert timers == ["events", "both"]  # the oracle's kernel time ranks nothing
    assert calls == ["torch", "reference-f64"]  # one checked call each (peak memory per call)


@pytest.mark.parametrize("guess, probed", [(3, ["1", "3", "4"]), (10, None), (None, None)])
def test_a_limit_search_probes_the_backends_guess_first(tmp_path, monkeypatch, guess, probed):
    # crashy dies from batch 4 on: a right guess (3) ends the search after 3 probes; a wrong
    # one (10) or none still finds the limit by bisection
    monkeypatch.setattr(backends.get("crashy"), "limit_guess", lambda case, axis, arch: guess)
    runner = Runner(ResultWriter(tmp_path), arch="cpu", plugins=[PLUGIN], progress=False)
    row = runner.find_limit(LimitSearch("batch_size", 1, 64, "crashy", tiny(1)))
    assert (row["last_ok"], row["first_fail"]) == (3, 4)
    if probed:
        assert list(row["probes"]) == probed and row["info"]["guess"] == 3
    else:
        assert len(row["probes"]) > 3


def test_flashmla_guesses_its_decode_scheduler_limit():
    from dsv4bench.backends.flashmla import FlashMLA

    fm = FlashMLA()
    chunk = make_case(V4, op="prefill", tokens=8192, context_len=32768, route="decode-kernel")
    assert fm.limit_guess(chunk, "tokens", "sm90") == 11622  # results/sm90/baseline-h100
    mixed = replace(chunk, route="decode-mixed")
    assert fm.limit_guess(mixed, "tokens", "sm90") is None  # an int32 stride limit instead
    assert fm.limit_guess(chunk, "context_len", "sm90") is None
    assert fm.limit_guess(make_case(V4), "batch_size", "sm90") == 11622
