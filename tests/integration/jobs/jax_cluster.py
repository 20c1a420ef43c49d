"""Processes of a multi-process JAX job (``jax_mp_job.py``) on localhost: free ports, bounded waits, signals.

Each process gets ``devices`` CPU devices (2 unless told) and gloo collectives; the job's coordination
service listens on a free port. Every wait is bounded by ``timeout_s`` (derived by the tests from a measured
run); a failed wait SIGKILLs every process before failing, so one failure never leaves processes behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from cluster import WorkerCluster, free_ports
from locations import REPO, job_script


def differing(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """The variables (by position: ``NNN:path``, a path Keras may number otherwise) whose arrays differ bit for bit,
    or that only one side has."""
    a, b = ({k.split(":")[0]: v for k, v in d.items()} for d in (a, b))
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not np.array_equal(a[k], b[k]))


class JaxJob(WorkerCluster):
    """``n`` processes of ``script DIST DIR EPOCHS OUT PORT RANK N [flags]``; ``extra[i]``: rank ``i``'s flags,
    ``devices``: CPU devices per process.

    Logs go to ``<name>-p<i>.log`` in ``tmp``, final arrays to ``<name>-p<i>.npz``. Waiting, killing, exit
    codes and the saved arrays are :class:`~cluster.WorkerCluster`'s; only the launch differs.
    """

    def __init__(
        self, tmp: Path, name: str, dist: str, directory: Path, epochs: int, n: int = 2, extra=None,
        timeout_s: float = 240, env: dict | None = None, script: str = "jax_mp_job.py", devices: int = 2,
    ) -> None:  # fmt: skip
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.outs = [tmp / f"{name}-p{i}.npz" for i in range(n)]
        self.logs = [tmp / f"{name}-p{i}.log" for i in range(n)]
        (port,) = free_ports(1)
        base = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
        base["JAX_NUM_CPU_DEVICES"] = str(devices)
        base.update({"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"})
        base.pop("TF_CONFIG", None)
        base.update(env or {})
        self.procs: list[subprocess.Popen] = []
        for i in range(n):
            args = [sys.executable, str(job_script(script)), dist, str(directory), str(epochs)]
            args += [str(self.outs[i]), str(port), str(i), str(n), *((extra or {}).get(i, []))]
            with open(self.logs[i], "wb") as log:
                self.procs.append(subprocess.Popen(args, env=base, stdout=log, stderr=subprocess.STDOUT))

    def signal(self, i: int, sig: int) -> None:
        """Send ``sig`` to process ``i`` (if it still runs)."""
        if self.procs[i].poll() is None:
            os.kill(self.procs[i].pid, sig)

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
