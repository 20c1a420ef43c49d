"""A dead peer in a multi-process JAX fit: the survivor ends within the documented bound, saying why.

2 processes x 2 CPU devices (``jax_mp_job.py``, DataParallel, sync saves). One process is killed with
SIGKILL while the other waits for it at a save's meeting point, or in the middle of training (in a
device collective). The bounds are the documented knobs, lowered for the test:
``jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_S)`` in the job and
``CANDLE_CKPT_GROUP_TIMEOUT_S=GROUP_S``. The survivor must end within the heartbeat timeout plus
a margin scaled to this machine's measured speed (``pace.wait_s``), never hang, and its output
must say why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob  # noqa: E402
from pace import wait_s  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real multi-process jobs (seconds each)
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

HEARTBEAT_S = 10  # jax.distributed.initialize(heartbeat_timeout_seconds=...): how soon the service sees a dead task
GROUP_S = 5  # CANDLE_CKPT_GROUP_TIMEOUT_S: the bound on one meeting point
JAX_FATAL = "Terminating process because the JAX distributed service detected fatal errors"


def _start(tmp_path, victim: int, pause: str) -> JaxJob:
    """A 3-epoch job whose process ``victim`` pauses (``pause`` flag) and prints PAUSED; every wait bounded."""
    flags = {i: [f"--heartbeat={HEARTBEAT_S}"] for i in (0, 1)}
    flags[victim].append(pause)
    env = {"CANDLE_CKPT_GROUP_TIMEOUT_S": str(GROUP_S)}
    job = JaxJob(tmp_path, "d", "dp", tmp_path / "ck", 3, extra=flags, timeout_s=wait_s(60), env=env)
    job.wait_for(victim, "PAUSED")
    return job


def _survivor_ends(job: JaxJob, victim: int) -> tuple[int, float, str]:
    """SIGKILL ``victim``; return the survivor's exit status, seconds until it ended, and its output."""
    survivor = 1 - victim
    job.kill(victim)
    start, bound = time.monotonic(), HEARTBEAT_S + wait_s(20)
    try:
        code = job.procs[survivor].wait(timeout=bound)
    except subprocess.TimeoutExpired:
        job.kill()
        pytest.fail(f"process {survivor} still ran {bound:.0f} s after its peer died:\n{job.output(survivor)[-3000:]}")
    return code, time.monotonic() - start, job.output(survivor)


def test_peer_dies_while_the_other_waits_at_a_save(tmp_path):
    """Process 1 is killed before its part of epoch 2; process 0, waiting for that part, gives up after GROUP_S naming
    rank 1 and the meeting point, then JAX's service ends it once the heartbeat timeout confirms the death; epoch 2 is
    never published."""
    job = _start(tmp_path, 1, "--pause-epoch-end=1")
    code, took, out = _survivor_ends(job, 1)
    assert code == -signal.SIGABRT, out[-3000:]
    assert "GroupTimeout: the processes did not all reach 'save/" in out and "rank(s) 1 never came" in out, out[-3000:]
    assert JAX_FATAL in out and "another task died" in out, out[-3000:]
    assert took >= GROUP_S  # it waited for its peer as documented, not less
    epochs = sorted(p.name for p in (tmp_path / "ck" / "ckpts" / "epochs").iterdir())
    assert epochs == ["001"]


@pytest.mark.parametrize("victim", [0, 1])
def test_peer_dies_in_mid_training(tmp_path, victim):
    """A process is killed in mid-epoch while the other runs the next training step (a device collective): the
    survivor ends with JAX's fatal error saying a task died: at once when process 0 (which hosts the service) died,
    within the heartbeat timeout when process 1 did."""
    job = _start(tmp_path, victim, "--pause-at=1:1")
    code, _, out = _survivor_ends(job, victim)
    assert code == -signal.SIGABRT, out[-3000:]
    assert JAX_FATAL in out and "another task died" in out, out[-3000:]
    why = "leader task was preempted/died" if victim == 0 else "stopped sending heartbeats"
    assert why in out, out[-3000:]
