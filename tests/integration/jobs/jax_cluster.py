"""Processes of a multi-process JAX job (``jax_mp_job.py``) on localhost: free ports, bounded waits, signals.

Each process gets 2 CPU devices and gloo collectives; the job's coordination service listens on a free
port. Every wait is bounded by ``timeout_s`` (derived by the tests from a measured run); a failed wait
SIGKILLs every process before failing, so one failure never leaves processes behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cluster import free_ports
from locations import REPO, job_script


class JaxJob:
    """``n`` processes of ``jax_mp_job.py DIST DIR EPOCHS OUT PORT RANK N [flags]``; ``extra[i]``: rank ``i``'s flags.

    Logs go to ``<name>-p<i>.log`` in ``tmp``, final arrays to ``<name>-p<i>.npz``.
    """

    def __init__(
        self, tmp: Path, name: str, dist: str, directory: Path, epochs: int, n: int = 2, extra=None,
        timeout_s: float = 240, env: dict | None = None,
    ) -> None:  # fmt: skip
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.outs = [tmp / f"{name}-p{i}.npz" for i in range(n)]
        self.logs = [tmp / f"{name}-p{i}.log" for i in range(n)]
        (port,) = free_ports(1)
        base = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", JAX_NUM_CPU_DEVICES="2")
        base.update({"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"})
        base.pop("TF_CONFIG", None)
        base.update(env or {})
        self.procs: list[subprocess.Popen] = []
        for i in range(n):
            args = [sys.executable, str(job_script("jax_mp_job.py")), dist, str(directory), str(epochs)]
            args += [str(self.outs[i]), str(port), str(i), str(n), *((extra or {}).get(i, []))]
            with open(self.logs[i], "wb") as log:
                self.procs.append(subprocess.Popen(args, env=base, stdout=log, stderr=subprocess.STDOUT))

    def output(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def wait_for(self, i: int, marker: str) -> None:
        """Wait until process ``i`` prints ``marker``; kill the job and fail otherwise."""
        deadline = time.monotonic() + self.timeout_s
        while marker not in self.output(i):
            if self.procs[i].poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"process {i} never printed {marker!r}:\n{self.output(i)[-4000:]}")
            time.sleep(0.1)

    def signal(self, i: int, sig: int) -> None:
        if self.procs[i].poll() is None:
            os.kill(self.procs[i].pid, sig)

    def kill(self, i: int | None = None) -> None:
        """SIGKILL process ``i`` (None: every process still running) and reap it."""
        for j, p in enumerate(self.procs):
            if (i is None or i == j) and p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)

    def exit_codes(self, timeout_s: float | None = None) -> list[int]:
        """Wait for every process (bounded: kill the job and fail on timeout); return their exit codes."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        for i, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"the job timed out; process {i}:\n{self.output(i)[-4000:]}")
        return [p.returncode for p in self.procs]

    def succeed(self) -> float:
        """Wait for a clean exit of every process (assert it); return the job's wall time in seconds."""
        codes = self.exit_codes()
        for i, code in enumerate(codes):
            assert code == 0 and "DONE" in self.output(i), f"process {i} exited {code}:\n{self.output(i)[-4000:]}"
        return time.monotonic() - self.started

    def restored_epoch(self, i: int) -> int:
        for line in self.output(i).splitlines():
            if line.startswith("RESTORED epoch="):
                return int(line.split("=")[1])
        raise AssertionError(f"process {i} printed no RESTORED line:\n{self.output(i)[-4000:]}")

    def final(self, i: int) -> dict[str, np.ndarray]:
        return dict(np.load(self.outs[i]))

    def restored(self, i: int) -> dict[str, np.ndarray]:
        return dict(np.load(str(self.outs[i]) + ".restored.npz"))
