"""What `backends` and `plan` learn by loading a kernel library, asked of a process of its own.

Loading a library can end the process that loads it: a cut `.so` in the kernels folder maps
pages past its end (SIGBUS), TileLang's tvm_ffi built for another Python aborts or misses a
symbol. A run's workers load libraries away from the CLI already (run/worker.py); here the
two questions the listing commands ask of a backend (which build it found, whether it takes a
case) go to one child process, `python -m dsv4bench.commands.isolated`, that builds the same
backends (plugins, options) and answers one JSON line per question. A child that dies answers
for that backend with how it died; the next backend gets a fresh child. The oracle and the
Triton kernels load nothing native of their own: they are asked here."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile

from dsv4bench.run.runner import child_env

MARK = "@@dsv4bench-isolated@@ "  # an answer line: kernel libraries may print to stdout too
IN_PROCESS = ("torch", "torch-topk", "reference-f64", "triton")  # only torch/Triton loaded


def in_process(backend) -> bool:
    return backend.base in IN_PROCESS


class Isolated:
    """The child process (started at the first question) and the backends that ended one."""

    def __init__(self, plugins: list[str]):
        self.plugins = list(plugins)
        self.proc: subprocess.Popen | None = None
        self.dead: dict[str, str] = {}  # backend -> how loading it ended a child

    def found(self, name: str) -> str:
        """kernels_found of backend `name`, or why a child asking it died."""
        answer = self._ask(name, {"kind": "found"})
        return answer if isinstance(answer, str) else f"not available: {self.dead[name]}"

    def supports(self, name: str, jobs: list[tuple]) -> list[str | None]:
        """backend.supports(case, arch) of each (case, arch) in `jobs`."""
        request = {"kind": "supports", "jobs": [(c.to_dict(), a) for c, a in jobs]}
        answer = self._ask(name, request)
        if isinstance(answer, list):
            return answer
        return [f"{name}: {self.dead[name]}"] * len(jobs)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def _ask(self, name: str, request: dict):
        if name in self.dead:
            return None
        proc = self._child()
        try:
            proc.stdin.write(json.dumps({**request, "backend": name}) + "\n")
            proc.stdin.flush()
            for line in proc.stdout:
                if line.startswith(MARK):
                    answer = json.loads(line[len(MARK) :])
                    if "error" in answer:
                        self.dead[name] = answer["error"]
                        return None
                    return answer["answer"]
        except (BrokenPipeError, OSError):
            pass
        self.dead[name] = self._death()
        return None

    def _child(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        from dsv4bench import backends

        self._stderr = tempfile.TemporaryFile(prefix="dsv4bench-isolated-")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4bench.commands.isolated"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=child_env(),
        )
        setup = {"plugins": self.plugins, "instances": backends.configured()}
        self.proc.stdin.write(json.dumps(setup) + "\n")
        self.proc.stdin.flush()
        return self.proc

    def _death(self) -> str:
        """How the child ended (its signal or exit code) and its stderr's last line."""
        proc, self.proc = self.proc, None
        rc = proc.wait()
        how = f"exit code {rc}"
        if rc < 0:
            how = f"signal {signal.Signals(-rc).name}"
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        last = f": {lines[-1].strip()[:300]}" if lines else ""
        return f"loading its kernel library ended the process that loaded it ({how}){last}"


def answer(backend, request: dict):
    """One question, answered in this (the child) process."""
    from dsv4bench.cases.case import Case
    from dsv4bench.commands.found import kernels_found

    if request["kind"] == "found":
        return kernels_found(backend)
    return [backend.supports(Case.from_dict(c), arch) for c, arch in request["jobs"]]


def main() -> int:
    from dsv4bench import backends

    setup = json.loads(sys.stdin.readline())
    backends.setup(setup["plugins"], setup["instances"])
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"answer": answer(backends.get(request["backend"]), request)}
        except Exception as e:  # a failure of one backend's loading is its answer
            reply = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(MARK + json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
