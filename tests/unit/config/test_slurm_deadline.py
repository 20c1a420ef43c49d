"""Issue 29: ``ckpt_deadline=auto`` before Slurm 23.02 asks ``scontrol``/``squeue`` once, in UTC, or warns once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from candle_ckpt.config import preemption as D
from candle_ckpt.engine.preempt import PreemptionWatcher
from candle_ckpt.engine.signals import SignalOwner

# ``scontrol show job 7`` of Slurm 22.05.8 (Debian 12), run with TZ=UTC: recorded.
SCONTROL = """JobId=7 JobName=quickstart
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:03 TimeLimit=00:03:00 TimeMin=N/A
   SubmitTime=2026-11-25T19:09:42 EligibleTime=2026-11-25T19:09:48
   AccrueTime=2026-11-25T19:09:48
   StartTime=2026-11-25T19:10:11 EndTime=2026-11-25T19:13:11 Deadline=N/A
   SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-25T19:10:11 Scheduler=Main
   Partition=main AllocNode:Sid=localhost:2841
"""
END = 1795633991.0  # 2026-11-25T19:13:11 UTC
PENDING = SCONTROL.replace("EndTime=2026-11-25T19:13:11", "EndTime=Unknown")


@pytest.fixture(autouse=True)
def fresh() -> None:
    """Each test starts with nothing asked and nothing warned (both are once per process)."""
    D._asked.clear()
    D._warned.clear()


def recorded(answers: dict[str, str | Exception], calls: list[list[str]]):
    """A ``run`` that answers each command with its recorded stdout (or raises the recorded error)."""

    def run(argv: list[str], env) -> str:
        calls.append(argv)
        answer = answers[argv[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return run


def test_scontrol_end_time_is_read_as_utc() -> None:
    """EndTime of scontrol's recorded output is the job's end in epoch seconds, the source names the command."""
    calls: list[list[str]] = []
    value, source = D.slurm_end_time("7", {}, recorded({"scontrol": SCONTROL}, calls))
    assert value == END
    assert source.startswith("scontrol show job 7 (SLURM_JOB_END_TIME is unset")
    assert calls == [["scontrol", "show", "job", "7"]]


def test_squeue_answers_when_scontrol_fails_or_knows_no_end() -> None:
    """scontrol missing (OSError) or EndTime=Unknown: squeue -o %e is asked next."""
    for first in (FileNotFoundError(2, "No such file or directory: 'scontrol'"), PENDING):
        calls: list[list[str]] = []
        value, source = D.slurm_end_time(
            "7", {}, recorded({"scontrol": first, "squeue": "2026-11-25T19:13:11\n"}, calls)
        )
        assert value == END and source.startswith("squeue -h -j 7 -o %e")
        assert [c[0] for c in calls] == ["scontrol", "squeue"]


def test_no_answer_means_no_deadline_and_one_warning() -> None:
    """Neither command answers: no deadline, and the warning (why, and what to do) is given once only."""
    answers = {"scontrol": OSError("exited 1: slurm_load_jobs error: Invalid job id specified"),
               "squeue": subprocess.TimeoutExpired(["squeue"], 10)}  # fmt: skip
    value, source = D.slurm_end_time("7", {}, recorded(answers, []))
    assert value is None
    warning = D.unwatched_warning("auto", source)
    assert warning is not None and warning.startswith("ckpt_deadline=auto: SLURM_JOB_END_TIME is unset")
    assert "Invalid job id specified" in warning and "no deadline is watched" in warning
    assert "pass ckpt_deadline as a time, or use sbatch --signal" in warning
    assert D.unwatched_warning("auto", source) is None
    assert D.unwatched_warning("+60", source) is None


def fake_slurm(folder: Path, end: str) -> dict[str, str]:
    """A ``scontrol`` on PATH that prints ``end`` (a ``date`` format of epoch ``END``) in its own TZ, and logs calls."""
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text(
        f'#!/bin/sh\necho "$@" >> {folder}/calls\necho "   StartTime=x EndTime=$(date -d @{int(END)} +{end})"\n'
    )
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "TZ": "America/New_York"}


def test_auto_runs_scontrol_once_per_process_in_utc_whatever_the_local_zone(tmp_path: Path) -> None:
    """resolve_deadline('auto') in a Slurm job without SLURM_JOB_END_TIME runs the real command once, with
    TZ=UTC, so a job whose TZ is New York gets the right instant."""
    env = fake_slurm(tmp_path / "bin", "%Y-%m-%dT%H:%M:%S")
    for _ in range(3):
        assert D.resolve_deadline("auto", 0.0, env)[0] == END
    assert (tmp_path / "bin" / "calls").read_text() == "show job 7\n"
    assert D.resolve_deadline("auto", 0.0, {**env, "SLURM_JOB_END_TIME": "5000"}) == (5000.0, "SLURM_JOB_END_TIME")


def test_auto_outside_slurm_asks_nothing(tmp_path: Path) -> None:
    """Without SLURM_JOB_ID, auto is no deadline and nothing is run or warned."""
    env = fake_slurm(tmp_path / "bin", "%s")
    env.pop("SLURM_JOB_ID")
    value, source = D.resolve_deadline("auto", 0.0, env)
    assert value is None and D.unwatched_warning("auto", source) is None
    assert not (tmp_path / "bin" / "calls").exists()


def test_a_signal_after_the_hold_is_held_for_the_watcher() -> None:
    """restart()'s hold keeps a SIGUSR1 (the process lives on); the next run's watcher gets it as its request
    and, once the run ends, the default handler that was there before is back."""
    old = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    owner = SignalOwner()
    try:
        assert owner.hold([signal.SIGUSR1]) == ["SIGUSR1"]
        os.kill(os.getpid(), signal.SIGUSR1)
        watcher = PreemptionWatcher([signal.SIGUSR1])
        lease = owner.watch(watcher.signals, watcher.notice)
        assert lease.caught == ["SIGUSR1"] and lease.held is not None
        assert watcher.pending is not None and watcher.pending.reason == "SIGUSR1"
        owner.end(lease)
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        owner.teardown(deliver=False)
        signal.signal(signal.SIGUSR1, old)


def test_a_held_signal_no_fit_takes_gets_its_default_action_after_the_grace() -> None:
    """No run watches within HOLD_GRACE_S: the held SIGTERM ends the process as it would have, with one warning."""
    code = (
        "import os, signal, time\n"
        "from candle_ckpt.engine import signals\n"
        "signals.HOLD_GRACE_S = 0.5\n"
        "signals.process_signals().hold([signal.SIGTERM])\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('alive', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr)
    assert proc.stdout == "alive\n"
    assert "SIGTERM came before training started and no fit began within 0.5 s" in proc.stderr


def test_the_first_run_ends_the_hold_of_signals_it_does_not_watch() -> None:
    """A run that watches other signals (or none) gives the held ones their previous handlers back."""
    old = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    owner = SignalOwner()
    try:
        assert owner.hold([signal.SIGUSR2]) == ["SIGUSR2"]
        assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL
        watcher = PreemptionWatcher([])
        lease = owner.watch(watcher.signals, watcher.notice)
        assert lease.caught == [] and watcher.pending is None
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
        owner.end(lease)
    finally:
        owner.teardown(deliver=False)
        signal.signal(signal.SIGUSR2, old)
