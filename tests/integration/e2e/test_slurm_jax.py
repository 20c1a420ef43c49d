"""A multi-process JAX job under a real one-node Slurm: ``srun -n 2`` and ``jax.distributed.initialize()``.

The sbatch script runs ``srun`` with two tasks of ``jax_mp_job.py`` (DataParallel, 2 CPU devices per
task, gloo), each calling ``jax.distributed.initialize()`` with no argument, so JAX reads Slurm's
environment for the coordinator, the process count and the rank. While both tasks pause in mid-epoch
the test sends ``scancel --signal=TERM``: both tasks save the same step and exit 143, the script requeues
the job (the README's recipe), and the requeued job resumes and completes. Each task's final weights
and optimizer variables must equal, bit for bit, those of the same rank in an uninterrupted 2-process
run on localhost (outside Slurm). Every wait is bounded by a multiple of that run's measured time.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from doclines import blocks
from locations import REPO, job_script
from slurm_cluster import missing, start_cluster

pytest.importorskip("jax")
from jax_cluster import JaxJob  # noqa: E402
from pace import wait_s  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # a Slurm cluster and three multi-process runs
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 4
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
SCRIPT = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=job.log

srun {python} {job} dp ck {epochs} out{{rank}}.npz slurm - - --pause-at=2:1:{pause} & step=$!
trap 'scancel --signal=TERM "$SLURM_JOB_ID"' TERM  # a SIGTERM to this shell: to the step
while wait "$step"; status=$?; kill -0 "$step" 2>/dev/null; do :; done  # until it exits
if [ "$status" -eq 143 ]; then
    echo "preempted (status $status): requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
exit "$status"
"""


# The README's requeue branch for a hang (status 124); rank 1 alone hangs, alive (its heartbeat going), in
# epoch 2 of the first run only. Its own limit is 3x longer: rank 0, the JAX service's host, finds the hang
# first (before the hand-off, JAX then aborted rank 1: srun returned 134, not requeued).
HANG_SCRIPT = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=job.log

srun {python} {job} dp ck {epochs} out{{rank}}.npz slurm - - --pause-at=2:1:600 --pause-rank=1 --pause-once \\
    --hang-timeout={timeout} --pauser-hang-timeout={stuck} & step=$!
trap 'scancel --signal=TERM "$SLURM_JOB_ID"' TERM  # a SIGTERM to this shell: to the step
while wait "$step"; status=$?; kill -0 "$step" 2>/dev/null; do :; done  # until it exits
if [ "$status" -eq 124 ]; then
    echo "stopped (status $status): requeueing job $SLURM_JOB_ID"  # 124: it hung
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
exit "$status"
"""


def _docs_script(command: str) -> str:
    """docs/multi-worker.rst's sbatch script, its ``python3 train.py`` replaced by ``command``."""
    (script,) = [b.astext() for b in blocks(REPO / "docs" / "multi-worker.rst", "bash") if "#SBATCH" in b.astext()]
    assert script.count("python3 train.py") == 1 and "--output=train.log" in script, script
    return script.replace("python3 train.py", command).replace("train.log", "job.log") + "\n"


def _task_pid(folder, rank: int) -> int | None:
    """The pid of the job's task ``rank`` (its environment's ``SLURM_PROCID``, its working directory ``folder``)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            here = os.readlink(f"/proc/{entry}/cwd") == str(folder)
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if here and f"SLURM_PROCID={rank}".encode() in environ and b"jax_mp_job" in command:
            return int(entry)
    return None


def _reference_and_hang_timeout(tmp_path) -> tuple[JaxJob, float, float]:
    """Skip without Slurm; else the uninterrupted 2-process run on localhost, its seconds, and a hang timeout well
    above the first step's compile on this machine."""
    why = missing()
    if why:
        pytest.skip(f"no Slurm here: {why}")
    ref = JaxJob(tmp_path, "ref", "dp", tmp_path / "ref-ck", EPOCHS, timeout_s=600)
    took = ref.succeed()
    return ref, took, max(wait_s(8.0), took / 2)


def _log(folder) -> str:
    return (folder / "job.log").read_text(errors="replace") if (folder / "job.log").exists() else ""


def _submit(cluster, folder, script: str) -> str:
    """sbatch ``script`` (job.sh in ``folder``) in the job's environment; its job id."""
    (folder / "job.sh").write_text(script)
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", JAX_NUM_CPU_DEVICES="2")
    env.update(cluster.env, KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        ["sbatch", "--parsable", "job.sh"], cwd=folder, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _until_final(cluster, job: str, bound: float, tick=None) -> dict:
    """Poll the job until a final state (``tick(info)`` at each poll), at most ``bound`` s (then scancel it)."""
    end, info = time.monotonic() + bound, {}
    while time.monotonic() < end:
        info = cluster.job(job)
        if tick is not None:
            tick(info)
        if info.get("JobState") in FINAL:
            return info
        time.sleep(1.0)
    cluster.cmd("scancel", job, check=False)
    return info


def _completed_as(ref: JaxJob, folder, info: dict) -> str:
    """Assert the job completed after a requeue, with each rank's arrays equal to ``ref``'s; its log."""
    log = _log(folder)
    assert info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0", f"{info}\n{log[-4000:]}"
    assert int(info.get("Restarts", "0")) >= 1, f"never requeued: {info}\n{log[-4000:]}"
    assert "requeueing job" in log and log.count("DONE") == 2, log[-4000:]
    for rank in (0, 1):
        got, want = dict(np.load(folder / f"out{rank}.npz")), ref.final(rank)
        assert sorted(got) == sorted(want)
        assert [k for k in got if not np.array_equal(got[k], want[k])] == [], f"rank {rank} differs"
    return log


def test_srun_two_tasks_preempted_requeued_end_bit_identical(tmp_path):
    """scancel --signal=TERM to a running ``srun -n 2`` JAX job: both tasks save the same step and exit 143, the job
    is requeued, resumes on both tasks and completes with each rank's arrays equal to an uninterrupted run's."""
    why = missing()
    if why:
        pytest.skip(f"no Slurm here: {why}")
    ref = JaxJob(tmp_path, "ref", "dp", tmp_path / "ref-ck", EPOCHS, timeout_s=600)
    bound = max(300.0, 8 * ref.succeed())
    cluster = start_cluster(tmp_path / "state")
    try:
        folder = tmp_path / "job"
        folder.mkdir()
        # Both tasks pause after batch 1 of epoch 2 (index) long enough for the signal to land in mid-epoch.
        pause = int(wait_s(5))
        job = _submit(cluster, folder, SCRIPT.format(python=sys.executable, job=job_script("jax_mp_job.py"),
                                                     epochs=EPOCHS, pause=pause))  # fmt: skip
        acted: list[bool] = []

        def tick(info: dict) -> None:
            if not acted and info.get("JobState") == "RUNNING" and "PAUSED" in _log(folder):
                cluster.cmd("scancel", "--signal=TERM", job)
                acted.append(True)

        info = _until_final(cluster, job, bound, tick)
        assert acted, f"never signalled: {info}\n{_log(folder)[-4000:]}"
        log = _completed_as(ref, folder, info)
        for rank in (0, 1):
            assert f"SIGTERM: process {rank} committed " in log and "(epoch 3, step " in log, log[-4000:]
    finally:
        cluster.stop()


def test_srun_two_tasks_one_hung_exits_124_requeued_ends_bit_identical(tmp_path):
    """Rank 1 of an ``srun -n 2`` JAX job hangs (alive) in epoch 2: both tasks end with 124 (rank 0 waits for
    rank 1 to leave first, so JAX does not abort it with 134), srun returns 124, the README's branch requeues
    the job, and the requeued job completes with each rank's arrays equal to an uninterrupted run's."""
    ref, took, timeout = _reference_and_hang_timeout(tmp_path)
    cluster = start_cluster(tmp_path / "state")
    try:
        folder = tmp_path / "job"
        folder.mkdir()
        job = _submit(cluster, folder, HANG_SCRIPT.format(python=sys.executable, job=job_script("jax_mp_job.py"),
                      epochs=EPOCHS, timeout=f"{timeout:.1f}", stuck=f"{3 * timeout:.1f}"))  # fmt: skip
        log = _completed_as(ref, folder, _until_final(cluster, job, max(300.0, 8 * took + 4 * timeout)))
        assert "stopped (status 124): requeueing job" in log, log[-4000:]
        # Each task's block (rank 1 heard of the hang from rank 0), and srun's word on both tasks: 124, none
        # aborted by JAX (134).
        assert "ERROR hang: process 0 of 2" in log and "ERROR hang: process 1 of 2" in log, log[-4000:]
        assert "process 0 of 2 found the job hung first" in log, log[-4000:]
        assert "Exited with exit code 124" in log and "Aborted" not in log, log[-4000:]
        assert "exit code 134" not in log, log[-4000:]
    finally:
        cluster.stop()


def test_the_docs_script_requeues_a_job_whose_task_is_stopped_and_it_ends_bit_identical(tmp_path):
    """docs/multi-worker.rst's sbatch script: rank 1 of ``srun -n 2`` is SIGSTOPped in epoch 2 (it cannot hear of the
    hang). Rank 0 exits 124 after its hand-off; ``srun --wait`` ends the stopped task later (killed: 137),
    so ``srun`` returns 137; the script requeues all the same (srun said a task exited 124), and the requeued job
    completes with each rank's arrays equal to an uninterrupted run's."""
    ref, took, timeout = _reference_and_hang_timeout(tmp_path)
    cluster = start_cluster(tmp_path / "state")
    stopped: list[int] = []
    try:
        folder = tmp_path / "job"
        folder.mkdir()
        command = (f"{sys.executable} {job_script('jax_mp_job.py')} dp ck {EPOCHS} out{{rank}}.npz slurm - - "
                   f"--pause-at=2:1:600 --pause-rank=1 --pause-once --hang-timeout={timeout:.1f}")  # fmt: skip
        script = _docs_script(command)
        wait = float(re.search(r"srun --wait=(\d+) ", script)[1])  # the page's bound on a task left behind
        job = _submit(cluster, folder, script)

        def tick(info: dict) -> None:
            if not stopped and info.get("JobState") == "RUNNING" and "PAUSED" in _log(folder):
                pid = _task_pid(folder, 1)
                if pid is not None:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)

        info = _until_final(cluster, job, max(300.0, 8 * took + 4 * timeout) + wait, tick)
        assert stopped, f"rank 1 never stopped: {info}\n{_log(folder)[-4000:]}"
        log = _completed_as(ref, folder, info)
        assert "ERROR hang: process 0 of 2" in log and "task 0: Exited with exit code 124" in log, log[-4000:]
        # srun's --wait killed the stopped task (137; 134 had JAX aborted it first): requeued by the hung() rule
        assert re.search(r"stopped \(status 13[47]\): requeueing job", log), log[-4000:]
    finally:
        for pid in stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        cluster.stop()
