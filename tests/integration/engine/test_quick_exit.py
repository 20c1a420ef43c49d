"""A preempted process ends right after its ``atexit`` handlers (``engine/preempt.quick_exit``), in a real process.

The job (``jobs/quick_exit_job.py``) sends itself a real SIGTERM in ``fit``; candle_ckpt commits a step checkpoint
and raises ``PreemptExit``. Uncaught, the process must end with 143 after the user's ``atexit`` handler ran and with
the files it left open closed (a gzip file's trailer written), but without the rest of the interpreter's teardown
(about 0.6 s of every SIGTERM in issue 45's goodput job): a ``__del__`` only that teardown calls does not run.
Caught by the script, which then exits with 0, the process ends as the script says, teardown included.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

from locations import REPO, job_script
from pace import wait_s


def run_job(tmp_path, *extra: str) -> tuple[int, list[str], str]:
    marks = tmp_path / "marks"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, str(job_script("quick_exit_job.py")), str(tmp_path / "ck"), str(marks), *extra],
        capture_output=True, text=True, env=env, timeout=wait_s(180),
    )  # fmt: skip
    lines = marks.read_text().split() if marks.exists() else []
    buffered = (tmp_path / "marks.buffered").read_text() if (tmp_path / "marks.buffered").exists() else ""
    try:  # a gzip file left open: whole only if it was closed (its trailer written), as the teardown closes it
        zipped = gzip.decompress((tmp_path / "marks.gz").read_bytes()).decode()
    except (OSError, EOFError) as err:
        zipped = f"unreadable: {err!r}\n"
    return done.returncode, lines, buffered + zipped + done.stderr[-2000:]


def test_an_uncaught_preemption_exit_runs_atexit_flushes_files_and_skips_the_teardown(tmp_path) -> None:
    code, marks, out = run_job(tmp_path)
    assert code == 143, out
    assert (tmp_path / "ck" / "ckpts" / "steps" / "002").is_dir(), out
    assert "exiting with status 143" in out
    assert marks == ["atexit"], (marks, out)  # no "teardown": the modules were not torn down
    assert out.startswith("buffered line\nzipped line\n"), out  # the files left open were closed before the exit


def test_a_caught_preemption_exit_ends_as_the_script_says_with_the_whole_teardown(tmp_path) -> None:
    code, marks, out = run_job(tmp_path, "--catch")
    assert code == 0, out
    assert marks == ["caught", "143", "atexit", "teardown"], (marks, out)
    assert out.startswith("buffered line\nzipped line\n"), out
