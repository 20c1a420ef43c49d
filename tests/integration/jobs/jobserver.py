"""The test side of a forking job server (``exact_job.py``, ``preempt_job.py``): one child per job, waits bounded."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from locations import REPO, job_script


class JobServer:
    """``script`` (a job server in ``jobs/``) in a subprocess; :meth:`run` sends it one job and waits for it."""

    def __init__(self, script: str, stderr: Path) -> None:
        self.script = script
        self.err = open(stderr, "w")  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
        self.proc = subprocess.Popen(
            [sys.executable, str(job_script(script))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
            text=True,
            bufsize=1,
        )
        self.stderr_path = stderr
        assert self.line(120) == "serving"

    def line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            pytest.fail(f"{self.script} said nothing for {timeout} s; stderr:\n{self.stderr_path.read_text()[-3000:]}")
        got = self.proc.stdout.readline()
        if not got:
            pytest.fail(f"{self.script} exited; stderr:\n{self.stderr_path.read_text()[-3000:]}")
        return got.strip()

    def run(self, *words: str, on_line: Callable[[str], None] | None = None) -> tuple[list[str], int]:
        """Run one job; ``on_line`` sees each progress line as it comes. Return the lines and the wait status."""
        self.proc.stdin.write(" ".join(words) + "\n")
        self.proc.stdin.flush()
        lines = []
        while not (got := self.line(120)).startswith("reaped "):
            lines.append(got)
            if on_line is not None:
                on_line(got)
        return lines, int(got.split()[1])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()
        self.err.close()
