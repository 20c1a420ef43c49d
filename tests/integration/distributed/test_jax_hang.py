"""A 2-process JAX job with one process stopped (SIGSTOP) in mid-epoch: the other ends with 124, the rerun is exact.

``jax_mp_job.py``, DataParallel over 2 processes x 2 CPU devices, at the defaults but for
``ckpt_hang_timeout`` (short, from this machine's measured speed) and a JAX heartbeat long enough that the
coordination service does not end the job first. The stopped process cannot run; the other waits for it in the
next step's collective, and its watchdog ends it with ``HANG_EXIT`` within the bound, naming the phase (a step
or a meeting). The test then SIGKILLs the stopped one, and the rerun ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob, differing  # noqa: E402
from pace import wait_s  # noqa: E402

from candle_ckpt.engine.watchdog import HANG_EXIT  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real multi-process jobs
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 3


def test_a_stopped_peer_ends_the_other_with_124_and_the_rerun_is_exact(tmp_path):
    """Process 1 is SIGSTOPped in epoch 2: process 0 exits 124 within ckpt_hang_timeout + a margin, its block in
    ckpt.log names a step or meeting hang with every stack; after SIGKILL of process 1 the rerun is exact."""
    ref = JaxJob(tmp_path, "ref", "dp", tmp_path / "ref", EPOCHS, timeout_s=wait_s(120))
    took = ref.succeed()
    want = [ref.final(0), ref.final(1)]
    timeout = max(wait_s(8.0), took / 2)  # well above the first step's compile on this machine
    flags = [f"--hang-timeout={timeout:.1f}", f"--heartbeat={int(4 * timeout + 120)}"]
    ck = tmp_path / "ck"
    job = JaxJob(tmp_path, "a", "dp", ck, EPOCHS, extra={0: flags, 1: [*flags, "--pause-at=1:1:60"]},
                 timeout_s=wait_s(120))  # fmt: skip
    job.wait_for(1, "PAUSED")
    job.signal(1, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        code = job.procs[0].wait(timeout=timeout + min(5.0, timeout / 10) + wait_s(20))
    except subprocess.TimeoutExpired:
        job.signal(1, signal.SIGCONT)
        job.kill()
        pytest.fail(f"process 0 still ran after its peer stopped:\n{job.output(0)[-3000:]}")
    ended = time.monotonic() - stopped
    job.kill(1)  # a stopped process takes SIGKILL
    assert code == HANG_EXIT, job.output(0)[-3000:]
    assert ended < timeout + wait_s(25), (ended, timeout)
    log = (ck / "ckpt.log").read_text()
    assert "hang: process 0 of 2 made no progress" in log, log[-3000:]
    assert "in phase step" in log or "in phase meeting" in log, log[-3000:]
    assert "Thread 0x" in log and "exiting with status 124" in log
    rerun = JaxJob(tmp_path, "b", "dp", ck, EPOCHS, timeout_s=wait_s(120))
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in (0, 1)] == [1, 1]
    for i in (0, 1):
        assert differing(rerun.final(i), want[i]) == [], f"process {i}"
