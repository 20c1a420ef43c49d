"""ckpt_save_steps=auto at the defaults, in real processes: step checkpoints taken on their own, a SIGKILL between two
of them loses less than the gap between them (at most 1.5 intervals), and the rerun ends bit-identical to an
uninterrupted run."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from pace import wait_s

JOB = Path(__file__).resolve().parents[1] / "jobs" / "interval_job.py"
STEP_S = 0.04  # what each step takes beyond the tiny model's own (a real model's step time)


def run(directory: Path, out: Path, phase: str, step_s: float) -> subprocess.CompletedProcess:
    """One job in a fresh process, bounded by the machine's measured pace."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(JOB.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(JOB), str(directory), str(out), phase, str(step_s)],
        capture_output=True, text=True, env=env, timeout=wait_s(240),
    )  # fmt: skip


def failing_history(directory: Path) -> None:
    """The restart history of a run that failed twice in the last 20 s (restart() writes these records)."""
    from candle_ckpt.core.history import append_local, new_record
    from candle_ckpt.core.layout import Layout

    history = Layout.at(str(directory)).history
    now = time.time()
    for at in (now - 20, now - 10, now):
        record = new_record("restart", resumed=None)
        record["time"] = at
        append_local(history, record)


def test_auto_steps_survive_a_sigkill_losing_less_than_the_gap_in_force(tmp_path) -> None:
    """At the defaults, a run that has been failing takes step checkpoints mid-epoch on its own; SIGKILLed one step
    short of its next one, the rerun resumes from the last one (less than the gap in force is lost) and ends
    bit-identical."""
    full = run(tmp_path / "full", tmp_path / "full.npz", "full", 0.0)
    assert full.returncode == 0, full.stderr[-3000:]
    failing_history(tmp_path / "job")
    # The job's last epoch stretches its steps to hold three intervals: a busy disk slows the save, and the 2% bound
    # with it, but not a sleep (at CI's load the interval once outgrew an epoch of fixed steps).
    step_s = STEP_S
    killed = run(tmp_path / "job", tmp_path / "killed.npz", "kill", step_s)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout, killed.stderr[-3000:])
    kill = [line.split() for line in killed.stdout.splitlines() if line.startswith("kill ")]
    assert kill, f"no step checkpoint in the last epoch: {killed.stdout}"
    step, saved, every, interval = map(int, kill[0][1:])
    # The gap taken is the interval spread evenly over the epoch (its end saves anyway): at most 1.5 intervals.
    assert every <= math.ceil(1.5 * interval), kill[0]
    resumed = run(tmp_path / "job", tmp_path / "resumed.npz", "resume", step_s)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"start 1 {saved}" in resumed.stdout  # from the step checkpoint of the last epoch
    # Killed in step `step`'s batch end, before the checkpoint callback saw it: steps saved+1 .. step-1 were done and
    # checked (no checkpoint was due at step-1, under the gap `every` then in force) and are lost.
    assert 0 <= step - 1 - saved < every
    print(f"killed after step {step} of the last epoch; resumed from step {saved}; gap {every}, interval {interval}")
    a, b = np.load(tmp_path / "full.npz"), np.load(tmp_path / "resumed.npz")
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        assert a[name].tobytes() == b[name].tobytes(), name
