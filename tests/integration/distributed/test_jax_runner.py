"""JobRunner with a custom JAX training loop in a multi-process job (keras.distribution), real processes on localhost.

Every job is 2 processes x 2 CPU devices with gloo collectives (``jax_runner_job.py``): the same script on
every process, one ``ckpt_directory``, a jitted ``stateless_call`` / ``stateless_apply`` step under
``DataParallel``, each process feeding its half of every batch in an order drawn from its own NumPy
generator (in the runner's ``state``), and ``runner.step_end()`` after every step.

Tolerance: none. Final weights, optimizer variables and each process's loop state are compared bit for
bit with the same process of an uninterrupted run. Waits are bounded by a multiple of the measured
reference run; a failed wait kills every process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real multi-process jobs (seconds each)
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 3
SCRIPT = "jax_runner_job.py"


def _job(tmp, name, ck, timeout_s, extra=None) -> JaxJob:
    return JaxJob(tmp, name, "dp", ck, EPOCHS, extra=extra, timeout_s=timeout_s, script=SCRIPT)


def _differ(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """The arrays that differ bit for bit, or that only one side has."""
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not np.array_equal(a[k], b[k]))


def _resumed(job: JaxJob, i: int) -> tuple[int, int]:
    found = job.line(i, r"^RESUMED epoch=(-?\d+) step=(\d+)$")
    return int(found.group(1)), int(found.group(2))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run: each process's final arrays, the wait allowed for one job (from its wall time), and its
    checkpoint directory."""
    tmp = tmp_path_factory.mktemp("runner-ref")
    job = _job(tmp, "ref", tmp / "ck", 600)
    took = job.succeed()
    assert [_resumed(job, i) for i in (0, 1)] == [(-1, 0), (-1, 0)]
    return [job.final(0), job.final(1)], max(90.0, 4 * took), tmp / "ck"


def test_every_process_writes_its_part_and_loop_state(reference):
    """A runner checkpoint of 2 processes: both parts, each process's own loop state, one manifest, no work/ left;
    the two processes' generators differ (each its own), the model is the same on both."""
    want, _, ck = reference
    epoch = ck / "ckpts" / "epochs" / f"{EPOCHS:03d}"
    names = sorted(p.name for p in epoch.iterdir())
    assert names == [
        "ckpt-info.json", "loop_state.p00000.json", "loop_state.p00000.npz", "loop_state.p00001.json",
        "loop_state.p00001.npz", "manifest.json", "part-00000.bin", "part-00000.json", "part-00001.bin",
        "part-00001.json",
    ]  # fmt: skip
    manifest = json.loads((epoch / "manifest.json").read_text())
    assert "loop_state/seen" in manifest["variables"] and any(p.startswith("opt/") for p in manifest["variables"])
    assert not (ck / "ckpts" / "work").exists()
    model = [k for k in want[0] if ":" in k]
    assert _differ({k: want[0][k] for k in model}, {k: want[1][k] for k in model}) == []
    assert not np.array_equal(want[0]["order_rng"], want[1]["order_rng"])


def test_kill9_mid_run_then_rerun_is_bit_identical(reference, tmp_path):
    """kill -9 of process 1 in epoch 2 (index 1); the rerun resumes epoch 1 on both processes and ends bit for bit
    as the uninterrupted run, on each process."""
    (want, bound, _), ck = reference, tmp_path / "ck"
    job = _job(tmp_path, "a", ck, bound, extra={1: ["--pause-at=1:2"]})
    job.wait_for(1, "PAUSED")
    job.kill(1)
    job.kill()  # the survivor waits in a collective for its dead peer: the test ends it
    rerun = _job(tmp_path, "b", ck, bound)
    rerun.succeed()
    assert [_resumed(rerun, i) for i in (0, 1)] == [(1, 0), (1, 0)]
    for i in (0, 1):
        assert _differ(rerun.final(i), want[i]) == [], f"process {i}"


def test_a_process_whose_restore_reads_never_return_ends_both_with_124(reference, tmp_path):
    """Process 1's checkpoint reads never return in train()'s restore: process 0 waits at the restore's meeting
    until the group's bound runs out and exits 124 naming it (as restart() does; not GroupTimeout, exit 1);
    process 1 hears of it and exits 124 too (not aborted by JAX); the rerun is exact. ckpt_hang_timeout is the
    default, auto, whose limit in a restore (600 s) is far longer than the bound: process 1 listens for the word
    after a quarter of the bound. Before, it listened after a quarter of its own limit (150 s), long after
    process 0 had gone, and JAX aborted it (-6), a status the Slurm script does not requeue."""
    (want, bound, _), ck = reference, tmp_path / "ck"
    job = _job(tmp_path, "a", ck, bound, extra={1: ["--pause-at=1:2"]})
    job.wait_for(1, "PAUSED")
    job.kill()  # a checkpoint of epoch 1 to resume from
    group_s = 8.0
    stuck = JaxJob(tmp_path, "s", "dp", ck, EPOCHS, extra={1: ["--stuck-reads"]}, timeout_s=bound, script=SCRIPT,
                   env={"CANDLE_CKPT_GROUP_TIMEOUT_S": str(group_s)})  # fmt: skip
    stuck.wait_for(1, "blocking")
    codes = stuck.exit_codes()
    assert codes == [124, 124], [stuck.output(i)[-3000:] for i in (0, 1)]
    assert "CANDLE_CKPT_GROUP_TIMEOUT_S" in stuck.output(0) and "rank(s) 1 never came" in stuck.output(0)
    assert "found the job hung first" in stuck.output(1), stuck.output(1)[-3000:]
    rerun = _job(tmp_path, "b", ck, bound)
    rerun.succeed()
    assert [_resumed(rerun, i) for i in (0, 1)] == [(1, 0), (1, 0)]
    for i in (0, 1):
        assert _differ(rerun.final(i), want[i]) == [], f"process {i}"


def test_sigterm_to_one_process_saves_the_same_step_with_its_reason(reference, tmp_path):
    """SIGTERM to process 1 only, in mid-epoch: both processes save the same step checkpoint, recorded as SIGTERM at
    process 1's request, and exit 143; the rerun resumes that step on both and ends bit-identical."""
    (want, bound, _), ck = reference, tmp_path / "ck"
    job = _job(tmp_path, "t", ck, bound, extra={1: ["--pause-at=1:2:3"]})
    job.wait_for(1, "PAUSED")
    job.signal(1, signal.SIGTERM)
    assert job.exit_codes() == [143, 143], [job.output(i)[-3000:] for i in (0, 1)]
    steps = sorted((ck / "ckpts" / "steps").iterdir())
    assert len(steps) == 1
    side = json.loads((steps[0] / "ckpt-info.json").read_text())
    assert side["epoch"] == 1 and side["step"] >= 2 and side["reason"] == "SIGTERM"
    assert {"loop_state.p00000.json", "loop_state.p00001.json", "part-00001.bin"} <= set(side["files"])
    log = (ck / "ckpt.log").read_text()
    assert f"SIGTERM: process 0 committed {steps[0]} at process 1's request (epoch 2, step {side['step']})" in log
    rerun = _job(tmp_path, "u", ck, bound)
    rerun.succeed()
    assert [_resumed(rerun, i) for i in (0, 1)] == [(1, side["step"])] * 2
    for i in (0, 1):
        assert _differ(rerun.final(i), want[i]) == [], f"process {i}"


def test_elastic_two_to_one_and_one_to_two(reference, tmp_path):
    """2 -> 1: the 2-process checkpoint restores into one process (with process 0's loop state) and, the job being
    done, it ends with the reference's arrays; 1 -> 2: a one-process checkpoint restores under 2 processes, each
    with the one process's model, optimizer and loop state."""
    want, bound, src = reference
    ck = tmp_path / "ck"
    shutil.copytree(src, ck, symlinks=True)
    down = JaxJob(tmp_path, "down", "dp", ck, EPOCHS, n=1, timeout_s=bound, script=SCRIPT)
    down.succeed()
    assert _resumed(down, 0) == (EPOCHS, 0)
    assert _differ(down.final(0), want[0]) == []
    one = JaxJob(tmp_path, "one", "dp", tmp_path / "ck1", EPOCHS, n=1, timeout_s=bound, script=SCRIPT)
    one.succeed()
    assert (tmp_path / "ck1" / "ckpts" / "epochs" / f"{EPOCHS:03d}" / "model.weights.h5").is_file()
    up = _job(tmp_path, "up", tmp_path / "ck1", bound)
    up.succeed()
    for i in (0, 1):
        assert _resumed(up, i) == (EPOCHS, 0)
        assert _differ(up.final(i), one.final(0)) == [], f"process {i}"
