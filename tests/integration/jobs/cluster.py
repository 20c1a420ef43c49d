"""Worker processes of a multi-worker job script on localhost, each with its own ``TF_CONFIG``; every wait bounded.

Used by the cluster tests (``dist_job.py``, ``mw_preempt_job.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from locations import REPO, job_script


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on localhost right now."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_procs(
    script: Path, args: list[list[str]], env: dict[str, str], timeout_s: float, stderr: int | None = None
) -> tuple[list[int], list[str]]:
    """Run ``script`` once per argument list (a small job of a few processes): their exit codes and outputs
    (``stderr=subprocess.STDOUT``: with stderr in them).

    Every wait is bounded: a process still running at ``timeout_s`` is killed, and the test fails.
    """
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", **env)
    env.pop("TF_CONFIG", None)
    procs = [
        subprocess.Popen([sys.executable, str(script), *a], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        for a in args
    ]
    try:
        outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], outs


def run_pair(script: Path, args: list[list[str]], env: dict[str, str], timeout_s: float) -> list[str]:
    """:func:`run_procs`, whose processes must all exit 0: their outputs."""
    codes, outs = run_procs(script, args, env, timeout_s)
    assert codes == [0] * len(codes), outs
    return outs


class WorkerCluster:
    """``n`` worker processes of ``script`` (``n == 1``: no TF_CONFIG); ``extra[i]``: worker ``i``'s arguments.

    Each runs ``script KIND DIRECTORY EPOCHS OUT [extra]`` and logs to ``<name>-w<i>.log`` in ``tmp``.
    """

    def __init__(
        self, script: str, tmp: Path, name: str, kind: str, directory: Path, epochs: int, n: int, extra=None,
        timeout_s: float = 300,
    ) -> None:  # fmt: skip
        self.timeout_s = timeout_s
        self.outs = [tmp / f"{name}-w{i}.npz" for i in range(n)]
        self.logs = [tmp / f"{name}-w{i}.log" for i in range(n)]
        ports = free_ports(n)
        self.procs: list[subprocess.Popen] = []
        for i in range(n):
            env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
            env.pop("TF_CONFIG", None)
            if n > 1:
                cluster = {"worker": [f"localhost:{p}" for p in ports]}
                env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            if kind == "tfk":
                env["TF_USE_LEGACY_KERAS"] = "1"
            args = [sys.executable, str(job_script(script)), kind, str(directory), str(epochs), str(self.outs[i])]
            args += list((extra or {}).get(i, []))
            with open(self.logs[i], "wb") as log:
                self.procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))

    def output(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def wait_for(self, i: int, marker: str, timeout: float | None = None) -> None:
        """Wait until worker ``i`` prints ``marker``; kill the cluster and fail otherwise."""
        deadline = time.monotonic() + (self.timeout_s if timeout is None else timeout)
        while marker not in self.output(i):
            if self.procs[i].poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"worker {i} never printed {marker!r}:\n{self.output(i)[-3000:]}")
            time.sleep(0.1)

    def kill(self, i: int | None = None) -> None:
        """SIGKILL worker ``i`` (None: every worker still running)."""
        for j, p in enumerate(self.procs):
            if (i is None or i == j) and p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)

    def kill_hung(self) -> str:
        """Ask every live worker for its threads' stacks (SIGUSR2: the job scripts register faulthandler for
        it), then kill them all; every worker's output, the stacks included, to show where the cluster hung."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            try:
                os.kill(p.pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
        if live:
            time.sleep(2.0)  # faulthandler writes at once; let the logs take it
        self.kill()
        return "\n".join(f"--- worker {j}:\n{self.output(j)[-6000:]}" for j in range(len(self.procs)))

    def exit_codes(self) -> list[int]:
        """Wait for every worker (bounded: kill the cluster and fail on timeout); return their exit codes."""
        deadline = time.monotonic() + self.timeout_s
        for i, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"cluster timed out waiting for worker {i}; every worker's output:\n{self.kill_hung()}")
        return [p.returncode for p in self.procs]

    def line(self, i: int, pattern: str) -> re.Match:
        """The first line of worker ``i``'s output matching ``pattern`` (asserted to exist)."""
        found = re.search(pattern, self.output(i), re.MULTILINE)
        assert found, f"worker {i} printed no {pattern!r}:\n{self.output(i)[-3000:]}"
        return found

    def final(self, i: int) -> dict[str, np.ndarray]:
        return dict(np.load(self.outs[i]))

    def restored(self, i: int) -> dict[str, np.ndarray]:
        return dict(np.load(str(self.outs[i]) + ".restored.npz"))
