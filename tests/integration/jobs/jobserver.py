"""The test side of a forking job server (``exact_job.py``, ``preempt_job.py``): one child per job, waits bounded.

Every request carries an id, and every line the server or the job prints
starts with it: :meth:`JobServer.run` reads only its own request's lines and
drops any other (a late line of a job an earlier test gave up on). A job that
says nothing for too long is killed and its test fails alone: the next
request gets its own answer. Waits scale with the machine's measured speed
(:mod:`pace`).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from locations import REPO, job_script
from pace import wait_s
from pipe_lines import PipeLines

QUIET_SILENCE_S = 60.0  # the longest a job is silent on a quiet machine, with margin (scaled by pace)


class JobServer:
    """``script`` (a job server in ``jobs/``) in a subprocess; :meth:`run` sends it one job and waits for it."""

    def __init__(self, script: str, stderr: Path, env: dict[str, str] | None = None) -> None:
        self.script, self.stderr_path = script, stderr
        self.extra_env = dict(env or {})  # e.g. KERAS_BACKEND: the server's, and so every job's
        self.err = open(stderr, "w")  # noqa: SIM115
        self.ids = itertools.count(1)
        self.own_lines: list[str] = []  # the server's own words (not led by a job id), shown if it exits
        self.proc: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", **self.extra_env}
        self.proc = subprocess.Popen(
            [sys.executable, str(job_script(self.script))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
            text=True,
            bufsize=1,
        )
        self.lines = PipeLines(self.proc.stdout)
        assert self.line(wait_s(QUIET_SILENCE_S) * 3) == "serving"

    def line(self, timeout: float) -> str | None:
        """The server's next line, or None when it said nothing for ``timeout`` seconds; fails if it exited."""
        try:
            got = self.lines.next(timeout)
        except EOFError:
            pytest.fail(
                f"{self.script} exited; it said {self.own_lines[-5:]}; stderr:\n{self.stderr_path.read_text()[-3000:]}"
            )
        return None if got is None else got.strip()

    def run(
        self, *words: str, on_line: Callable[[str], None] | None = None, silence_s: float | None = None
    ) -> tuple[list[str], int]:
        """Run one job; ``on_line`` sees each progress line as it comes. Return the lines and the wait status.

        A job silent for ``silence_s`` (default: :data:`QUIET_SILENCE_S`, scaled) is killed and the test fails.
        """
        if self.proc.poll() is not None:  # an earlier test lost the server: this one gets a new one
            self._start()
        job = str(next(self.ids))
        self.proc.stdin.write(" ".join([job, *words]) + "\n")
        self.proc.stdin.flush()
        lines: list[str] = []
        pid, silence = None, silence_s if silence_s is not None else wait_s(QUIET_SILENCE_S)
        while True:
            got = self.line(silence)
            if got is None:
                self._give_up(pid)
                pytest.fail(
                    f"{self.script}: job {job} ({' '.join(words)}) said nothing for {silence:.0f} s and was killed; "
                    f"its lines: {lines}; stderr:\n{self.stderr_path.read_text()[-3000:]}"
                )
            said, _, rest = got.partition(" ")
            if said != job:
                if not said.isdigit():
                    self.own_lines.append(got)
                continue  # another request's line (a job given up on earlier), or the server's own
            if rest.startswith("started "):
                pid = int(rest.split()[1])
            elif rest.startswith("reaped "):
                return lines, int(rest.split()[1])
            else:
                lines.append(rest)
                if on_line is not None:
                    on_line(rest)

    def _give_up(self, pid: int | None) -> None:
        """Kill a job that hangs; if the server does not reap it soon, replace the server."""
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s(10)
        while time.monotonic() < deadline:
            got = self.line(max(0.1, deadline - time.monotonic()))
            if got is not None and got.split()[1:2] == ["reaped"]:
                return
        self.proc.kill()
        self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=wait_s(12))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=60)
        self.proc.stdout.close()
        self.err.close()
