"""Checkpoint/restart of a multi-process JAX job (keras.distribution), with real processes on localhost.

Every job is 2 processes x 2 CPU devices with gloo collectives (``jax_mp_job.py``): the same script
on every process, one ``ckpt_directory``, ``restart()`` before ``fit`` and the callback in ``fit``
with its defaults (``shuffle=True``, validation data, a Dropout layer). ``dp`` is DataParallel over
the 4 devices (each process feeds its half of every batch), ``mp`` is ModelParallel with the first
kernel sharded over all 4 devices, so each process holds half of it.

Tolerance: none. Final weights and optimizer variables are compared bit for bit with an
uninterrupted run of the same shape. Waits are bounded by a multiple of the measured reference
run; a failed wait kills every process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob, differing  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real multi-process jobs (seconds each)
    # The jobs are JAX processes whatever this process runs: they run once, in the JAX pass of .ci/run.
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 3


_same = differing  # the arrays that differ bit for bit (the name this module's tests use)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs (dp at the defaults: ckpt_async=auto, asynchronous with 2 processes; mp with
    --sync): their directories, final arrays and wall time."""
    out = {}
    for dist, flags in (("dp", []), ("mp", ["--sync"])):
        tmp = tmp_path_factory.mktemp(f"ref-{dist}")
        job = JaxJob(tmp, "ref", dist, tmp / "ck", EPOCHS, extra={0: flags, 1: flags}, timeout_s=600)
        took = job.succeed()
        out[dist] = (tmp / "ck", [job.final(0), job.final(1)], took)
    return out


def _bound(reference) -> float:
    """The wait allowed for one job: several reference runs (a busy machine), at least 90 s."""
    return max(90.0, 4 * max(took for _, _, took in reference.values()))


def test_every_process_writes_its_shards_once(reference):
    """ModelParallel: the sharded kernel's chunks come from both processes, each value once, one commit."""
    ck, _, _ = reference["mp"]
    epoch = ck / "ckpts" / "epochs" / f"{EPOCHS:03d}"
    names = sorted(p.name for p in epoch.iterdir())
    assert names == [
        "ckpt-info.json", "config.json", "manifest.json", "metadata.json", "part-00000.bin", "part-00000.json",
        "part-00001.bin", "part-00001.json", "train.state.p00000.npz", "train.state.p00001.npz",
    ]  # fmt: skip
    manifest = json.loads((epoch / "manifest.json").read_text())
    kernel = manifest["variables"]["dense_a/kernel"]
    assert sorted({c["part"] for c in kernel["chunks"]}) == [0, 1]
    state_bytes = sum(
        int(np.prod(v["global_shape"], dtype=np.int64)) * np.dtype(v["dtype"]).itemsize
        for v in manifest["variables"].values()
    )
    written = sum(p["size"] for p in manifest["parts"])
    assert state_bytes <= written <= 1.05 * state_bytes + 64 * 4 * len(manifest["variables"])
    side = json.loads((epoch / "ckpt-info.json").read_text())
    assert side["model_file"] == "manifest.json" and set(side["files"]) == set(names) - {"ckpt-info.json"}
    assert not (ck / "ckpts" / "work").exists()


@pytest.mark.parametrize("dist, victim", [("dp", 1), ("mp", 0)])
def test_kill9_mid_epoch_then_rerun_is_bit_identical(reference, tmp_path, dist, victim):
    """kill -9 of one process in epoch 2; the rerun resumes epoch 1 on both and ends as the uninterrupted run."""
    _, want, _ = reference[dist]
    ck, bound = tmp_path / "ck", _bound(reference)
    job = JaxJob(tmp_path, "a", dist, ck, EPOCHS, extra={victim: ["--pause-at=1:1"]}, timeout_s=bound)
    job.wait_for(victim, "PAUSED")
    job.kill(victim)
    job.kill()  # the survivor waits in a collective for its dead peer: the test ends it
    rerun = JaxJob(tmp_path, "b", dist, ck, EPOCHS, timeout_s=bound)
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in (0, 1)] == [1, 1]
    for i in (0, 1):
        assert _same(rerun.final(i), want[i]) == [], f"process {i}"


@pytest.mark.parametrize("rank", [0, 1])
def test_corrupt_part_both_fall_back_together(reference, tmp_path, rank):
    """A damaged part of the newest checkpoint: both processes resume the one before, and end bit-identical.
    Each process checks the CRC of the part it reads: the primary rejects its own damaged part while choosing;
    process 1's is rejected by process 1, and the primary then chooses again, logging why."""
    src, want, _ = reference["mp"]
    ck = tmp_path / "ck"
    shutil.copytree(src, ck, symlinks=True)
    part = ck / "ckpts" / "epochs" / f"{EPOCHS:03d}" / f"part-0000{rank}.bin"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    job = JaxJob(tmp_path, "c", "mp", ck, EPOCHS, timeout_s=_bound(reference))
    job.succeed()
    assert [job.restored_epoch(i) for i in (0, 1)] == [EPOCHS - 1, EPOCHS - 1]
    log = (ck / "ckpt.log").read_text()
    assert f"skipping epoch {EPOCHS}" in log and f"part-0000{rank}.bin: CRC32 is" in log
    if rank == 1:
        assert f"process 1: {ck / 'ckpts' / 'epochs' / f'{EPOCHS:03d}' / 'part-00001.bin'}" in log
    for i in (0, 1):
        assert _same(job.final(i), want[i]) == [], f"process {i}"


@pytest.mark.parametrize("src, dist, n", [("mp", "dp", 2), ("dp", "mp", 2), ("mp", "none", 1)])
def test_elastic_restore_is_bit_identical(reference, tmp_path, src, dist, n):
    """A 2-process checkpoint restores under the other distribution, or in one process with none (there into a
    second model of the process, whose optimizer Keras names adam_1: matched by position)."""
    ck_src, want, _ = reference[src]
    ck = tmp_path / "ck"
    shutil.copytree(ck_src, ck, symlinks=True)
    extra = {0: ["--second-model"]} if n == 1 else None
    job = JaxJob(tmp_path, "e", dist, ck, EPOCHS, n=n, extra=extra, timeout_s=_bound(reference))
    job.succeed()
    for i in range(n):
        assert job.restored_epoch(i) == EPOCHS
        assert _same(job.restored(i), want[0]) == [], f"process {i}"


def test_one_process_checkpoint_restores_under_two(reference, tmp_path):
    """1 -> 2: a one-process model.keras checkpoint restores into ModelParallel shards on both processes."""
    ck = tmp_path / "ck"
    one = JaxJob(tmp_path, "one", "none", ck, 1, n=1, timeout_s=_bound(reference))
    one.succeed()
    assert (ck / "ckpts" / "epochs" / "001" / "model.keras").is_file()
    two = JaxJob(tmp_path, "two", "mp", ck, 1, timeout_s=_bound(reference))
    two.succeed()
    for i in (0, 1):
        assert two.restored_epoch(i) == 1
        assert _same(two.restored(i), one.final(0)) == [], f"process {i}"


def test_sigterm_to_one_process_saves_the_same_step_everywhere(reference, tmp_path):
    """SIGTERM to process 1 only: both save the same step checkpoint, recorded as SIGTERM (the primary's record
    names process 1 as the one asked), and exit 143 (128 + SIGTERM, the default); the rerun ends bit-identical."""
    _, want, _ = reference["dp"]
    ck, bound = tmp_path / "ck", _bound(reference)
    job = JaxJob(tmp_path, "t", "dp", ck, EPOCHS, extra={1: ["--pause-at=1:1:3"]}, timeout_s=bound)
    job.wait_for(1, "PAUSED")
    job.signal(1, signal.SIGTERM)
    codes = job.exit_codes()
    assert codes == [143, 143], [job.output(i)[-3000:] for i in (0, 1)]
    steps = sorted((ck / "ckpts" / "steps").iterdir())
    assert len(steps) == 1
    side = json.loads((steps[0] / "ckpt-info.json").read_text())
    assert side["epoch"] == 1 and side["step"] >= 2 and side["reason"] == "SIGTERM"  # the request's own reason
    assert {"part-00000.bin", "part-00001.bin", "train.state.p00001.npz"} <= set(side["files"])
    for i, by in ((0, " at process 1's request"), (1, "")):
        said = f"SIGTERM: process {i} committed {steps[0]}{by} (epoch 2, step {side['step']})"
        assert said in job.output(i) and "exiting with status 143" in job.output(i)
    rerun = JaxJob(tmp_path, "u", "dp", ck, EPOCHS, timeout_s=bound)
    rerun.succeed()
    for i in (0, 1):
        assert _same(rerun.final(i), want[i]) == [], f"process {i}"
