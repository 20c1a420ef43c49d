"""2-process JAX jobs with one process stuck: the job ends with 124 within its bound, the rerun is exact.

Stuck in mid-epoch (SIGSTOP, or alive and sleeping in a callback), before its ``restart()`` (its set-up never
ends: the other waits in ``restart()``'s first collective), and in ``restart()``'s reads (its disk stopped
answering: the other waits at the restore's meeting until ``CANDLE_CKPT_GROUP_TIMEOUT_S``).

``jax_mp_job.py``, DataParallel over 2 processes x 2 CPU devices, at the defaults but for
``ckpt_hang_timeout`` (short, from this machine's measured speed) and a JAX heartbeat long enough that the
coordination service does not end the job first. The process waiting for the stuck one ends with ``HANG_EXIT``
within the bound, naming the phase; a stuck one whose watchdog runs ends with 124 too (it hears of the hang, and
process 0, the JAX service's host, leaves last: engine/hang_notice.py), so ``srun`` would return 124. The test
then SIGKILLs what is left, and the rerun ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob, differing  # noqa: E402
from pace import wait_s  # noqa: E402

from candle_ckpt.engine.hang_notice import HANDOFF_S  # noqa: E402
from candle_ckpt.engine.watchdog import HANG_EXIT  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real multi-process jobs
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 3


@pytest.mark.parametrize("how", ["stopped", "stuck"])
def test_a_peer_stopped_or_stuck_in_mid_epoch_ends_the_job_with_124_and_the_rerun_is_exact(tmp_path, how):
    """Process 1 is SIGSTOPped (``stopped``) or sleeps in a callback (``stuck``: alive, its heartbeat going) in
    epoch 2: process 0 exits 124 within ckpt_hang_timeout + a margin (+ its wait for process 1 to leave first),
    its block in ckpt.log names a step or meeting hang with every stack. A stuck process 1 exits 124 too, not
    134 (JAX's abort when process 0, its service's host, exits first): srun's status is 124, requeued. Then
    the rerun is exact."""
    ref = JaxJob(tmp_path, "ref", "dp", tmp_path / "ref", EPOCHS, timeout_s=wait_s(120))
    took = ref.succeed()
    want = [ref.final(0), ref.final(1)]
    timeout = max(wait_s(8.0), took / 2)  # well above the first step's compile on this machine
    beat = f"--heartbeat={int(4 * timeout + 120)}"
    ck = tmp_path / "ck"
    # Process 1's own limit is longer: process 0 finds the hang first, and exits first but for the hand-off.
    stuck = [f"--hang-timeout={3 * timeout:.1f}", beat, "--pause-at=1:1:600"]
    job = JaxJob(tmp_path, "a", "dp", ck, EPOCHS, extra={0: [f"--hang-timeout={timeout:.1f}", beat], 1: stuck},
                 timeout_s=wait_s(120))  # fmt: skip
    job.wait_for(1, "PAUSED")
    if how == "stopped":
        job.signal(1, signal.SIGSTOP)
    code, ended = _ended(job, 0, timeout + min(5.0, timeout / 10) + HANDOFF_S + wait_s(20))
    other = _ended(job, 1, wait_s(10))[0] if how == "stuck" else None
    job.kill(1)  # a stopped process takes SIGKILL
    assert code == HANG_EXIT, job.output(0)[-3000:]
    assert ended < timeout + HANDOFF_S + wait_s(25), (ended, timeout)
    log = (ck / "ckpt.log").read_text()
    assert "hang: process 0 of 2 made no progress" in log, log[-3000:]
    assert "in phase step" in log or "in phase meeting" in log, log[-3000:]
    assert "Thread 0x" in log and "exiting with status 124" in log
    if how == "stuck":
        assert other == HANG_EXIT, job.output(1)[-3000:]
        assert "process 0 of 2 found the job hung first" in job.output(1), job.output(1)[-3000:]
    _rerun_is_exact(tmp_path, ck, want)


def _resumable(tmp_path):
    """A reference run of EPOCHS and a 1-epoch run in ``ck`` (a checkpoint to resume from): (want, ck, pace)."""
    ref = JaxJob(tmp_path, "ref", "dp", tmp_path / "ref", EPOCHS, timeout_s=wait_s(120))
    took = ref.succeed()
    ck = tmp_path / "ck"
    JaxJob(tmp_path, "one", "dp", ck, 1, timeout_s=wait_s(120)).succeed()
    return [ref.final(0), ref.final(1)], ck, took


def _ended(job: JaxJob, i: int, bound: float) -> tuple[int, float]:
    """Process ``i``'s exit status and seconds until it ended, waiting at most ``bound`` (else kill all, fail)."""
    began = time.monotonic()
    try:
        code = job.procs[i].wait(timeout=bound)
    except subprocess.TimeoutExpired:
        out = job.output(i)[-3000:]
        job.kill()
        pytest.fail(f"process {i} still ran after {bound:.0f} s:\n{out}")
    return code, time.monotonic() - began


def _rerun_is_exact(tmp_path, ck, want) -> None:
    rerun = JaxJob(tmp_path, "b", "dp", ck, EPOCHS, timeout_s=wait_s(120))
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in (0, 1)] == [1, 1]
    for i in (0, 1):
        assert differing(rerun.final(i), want[i]) == [], f"process {i}"


def test_a_peer_stuck_before_its_restart_ends_the_other_in_restart_with_124(tmp_path):
    """Process 1 never reaches restart() (alive, heartbeating: its set-up hangs): process 0, in restart()'s first
    collective (the optimizer's variables under the distribution), exits 124 within ckpt_hang_timeout + a margin,
    its block names phase restore with the stack in the optimizer's build; the rerun is exact."""
    want, ck, took = _resumable(tmp_path)
    timeout = max(wait_s(8.0), took / 2)
    flags = [f"--hang-timeout={timeout:.1f}", f"--heartbeat={int(4 * timeout + 120)}"]
    job = JaxJob(tmp_path, "a", "dp", ck, EPOCHS, extra={0: flags, 1: [*flags, "--pause-before-restart=600"]},
                 timeout_s=wait_s(120))  # fmt: skip
    job.wait_for(1, "PAUSED")
    code, ended = _ended(job, 0, timeout + HANDOFF_S + wait_s(60))
    job.kill(1)  # outside restart(), no watchdog of ours hears: process 0 waited HANDOFF_S for it
    assert code == HANG_EXIT, job.output(0)[-3000:]
    assert ended < timeout + HANDOFF_S + wait_s(25), (ended, timeout)
    log = (ck / "ckpt.log").read_text()
    assert "hang: process 0 of 2 made no progress" in log and "in phase restore" in log, log[-3000:]
    assert "build_optimizer" in log and "exiting with status 124" in log, log[-3000:]
    _rerun_is_exact(tmp_path, ck, want)


def test_a_peer_whose_restore_reads_never_return_ends_both_with_124(tmp_path):
    """Process 1's checkpoint reads never return: process 0 waits at the restore's meeting, and when the group's
    bound (CANDLE_CKPT_GROUP_TIMEOUT_S) runs out it exits 124 naming the meeting point and rank 1 (not a
    GroupTimeout traceback, exit 1); the history records the hang of the restore; the rerun is exact."""
    want, ck, took = _resumable(tmp_path)
    group_s = max(wait_s(8.0), took / 2)
    flags = [f"--hang-timeout={4 * group_s:.1f}", f"--heartbeat={int(8 * group_s + 120)}"]
    env = {"CANDLE_CKPT_GROUP_TIMEOUT_S": f"{group_s:.1f}"}
    job = JaxJob(tmp_path, "a", "dp", ck, EPOCHS, extra={0: flags, 1: [*flags, "--stuck-reads"]},
                 timeout_s=wait_s(120), env=env)  # fmt: skip
    job.wait_for(1, "blocking")
    code, ended = _ended(job, 0, 4 * group_s + HANDOFF_S + wait_s(60))
    other, _ = _ended(job, 1, wait_s(10))  # it heard process 0's word, and left first
    out = job.output(0)
    assert code == HANG_EXIT, out[-3000:]
    assert other == HANG_EXIT and "found the job hung first" in job.output(1), job.output(1)[-3000:]
    assert ended < 2 * group_s + HANDOFF_S + wait_s(25), (ended, group_s)
    assert "GroupTimeout" not in out, out[-3000:]
    log = (ck / "ckpt.log").read_text()
    assert "hang: process 0 of 2 made no progress" in log and "CANDLE_CKPT_GROUP_TIMEOUT_S" in log, log[-3000:]
    assert "rank(s) 1 never came" in log and "in phase restore" in log, log[-3000:]
    history = [json.loads(line) for line in (ck / "ckpts" / "restarts.jsonl").read_text().splitlines()]
    assert {"event": "failure", "error": "hang", "phase": "restore"}.items() <= history[-1].items(), history[-1]
    _rerun_is_exact(tmp_path, ck, want)
