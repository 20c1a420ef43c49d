"""Replica-parallel checkpoints of a multi-process JAX job: every process writes, and reads back, its share.

Real jobs (``jax_mp_job.py``) under DataParallel, where every process holds the whole state: a first Dense
layer of 8192 units makes the kernels (and their Adam moments) 256 KiB each, large enough to be cut in
slices; the smaller values are given whole, balanced. Asserted on disk and on what each process reports:
each part holds about 1/N of the state bytes, each process reads about 1/N at restore (the rest reaches it
by one collective), and kill -9 + rerun, elastic restores (2 -> 4 processes, 2 -> ModelParallel, 2 -> one
process under TensorFlow) and ``candle-ckpt consolidate`` (under TensorFlow) stay bit for bit.

Tolerance: none for the arrays; for the shares, 1/N plus the largest value given whole (16 KiB of ~960 KiB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob  # noqa: E402
from locations import REPO  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real multi-process jobs (a minute each on a busy machine)
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 2
WIDE = ["--hidden=8192", "--print-stats", "--verbose"]


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """The variables (by position) whose values differ, or that only one side has (dtypes may differ: int32/int64)."""
    a, b = ({k.split(":")[0]: v for k, v in d.items()} for d in (a, b))
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not np.array_equal(a[k], b[k]))


def _stats(job: JaxJob, i: int) -> dict:
    line = job.line(i, r"^STATS (.*)$")
    return json.loads(line.group(1))


def _state_bytes(manifest: dict) -> int:
    return sum(
        int(np.prod(v["global_shape"], dtype=np.int64)) * np.dtype(v["dtype"]).itemsize
        for v in manifest["variables"].values()
    )


def _shares(epoch_dir) -> tuple[list[int], int]:
    """The state bytes each part holds (its chunks, from its index), and the state's bytes."""
    manifest = json.loads((epoch_dir / "manifest.json").read_text())
    shares = []
    for rank in range(manifest["process_count"]):
        index = json.loads((epoch_dir / f"part-{rank:05d}.json").read_text())
        shares.append(sum(row["nbytes"] for row in index["chunks"]))
    return shares, _state_bytes(manifest)


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    """An uninterrupted 2-process DataParallel run: its directory, the job, its final arrays and wall time."""
    tmp = tmp_path_factory.mktemp("dp2")
    job = JaxJob(tmp, "ref", "dp", tmp / "ck", EPOCHS, extra={0: WIDE, 1: WIDE}, timeout_s=600)
    took = job.succeed()
    return tmp / "ck", job, [job.final(0), job.final(1)], took


def _bound(dp2) -> float:
    return max(120.0, 4 * dp2[3])


def test_each_of_two_processes_writes_half_of_the_state(dp2):
    """Every checkpoint: each part's chunks hold 1/2 of the state bytes (within one small value), each .bin no
    more than that plus alignment, and both processes wrote slices of the big kernels."""
    ck, _, _, _ = dp2
    for epoch in range(1, EPOCHS + 1):
        where = ck / "ckpts" / "epochs" / f"{epoch:03d}"
        shares, state = _shares(where)
        assert sum(shares) == state and state > 900_000
        for share in shares:
            assert abs(share - state / 2) <= 16 * 1024 + 64, (shares, state)
        for rank in (0, 1):
            assert (where / f"part-{rank:05d}.bin").stat().st_size <= state / 2 + 16 * 1024 + 64 * 20
        kernel = json.loads((where / "manifest.json").read_text())["variables"]["dense_a/kernel"]
        assert sorted(c["part"] for c in kernel["chunks"]) == [0, 1]
        assert sorted(tuple(c["index"][0]) for c in kernel["chunks"]) == [(0, 4), (4, 8)]


def test_every_rank_closes_with_what_it_wrote(dp2):
    """Process 1's closing report names its part of each checkpoint (not 'no checkpoints were written'); its
    stats() record each part's bytes, half the state; process 0 reports the commits."""
    ck, job, _, _ = dp2
    shares, _ = _shares(ck / "ckpts" / "epochs" / f"{EPOCHS:03d}")
    out1 = job.output(1)
    assert "no checkpoints were written" not in out1
    assert f"of {EPOCHS} checkpoints committed by process 0; last epoch {EPOCHS}; errors 0" in out1
    assert "report: wrote its part (" in out1
    saves = _stats(job, 1)["saves"]
    assert [s["epoch"] for s in saves] == list(range(1, EPOCHS + 1)) and all(s["part"] for s in saves)
    assert saves[-1]["bytes"] >= shares[1]
    assert f"report: {EPOCHS} checkpoints," in job.output(0)
    # ckpt_async's default (auto) in a 2-process job: every process wrote on its background writer
    assert _stats(job, 0)["async"] is True and _stats(job, 1)["async"] is True


def test_restore_reads_half_per_process_and_gathers_the_rest(dp2, tmp_path):
    """A rerun of the same 2 processes: each reads its own part (about half of the checkpoint's bytes) once, into
    memory, uses every slice of it in place, and gets the other half of the state from the other process; both
    restore the saved arrays bit for bit."""
    ck_src, _, want, _ = dp2
    ck = tmp_path / "ck"
    shutil.copytree(ck_src, ck, symlinks=True)
    job = JaxJob(tmp_path, "r", "dp", ck, EPOCHS, extra={0: WIDE, 1: WIDE}, timeout_s=_bound(dp2))
    job.succeed()
    where = ck / "ckpts" / "epochs" / f"{EPOCHS:03d}"
    shares, state = _shares(where)
    total = sum(f.stat().st_size for f in where.iterdir())
    for i in (0, 1):
        assert job.restored_epoch(i) == EPOCHS
        assert _same(job.restored(i), want[i]) == [], f"process {i}"
        load = _stats(job, i)["load"]
        assert load["slice_bytes"] == shares[i]  # its own slices: exactly what it wrote
        assert load["in_place_bytes"] == shares[i]  # all of them from its part read once, none copied
        assert load["gathered_bytes"] == state - shares[i]
        assert load["read_bytes"] <= total / 2 + 32 * 1024, (load, total)  # its part, manifest, its train state
        assert f"process {i} resumed" in job.output(i)


def test_four_processes_restore_two_and_each_write_a_quarter(dp2, tmp_path):
    """Elastic 2 -> 4 (1 CPU device each): all four restore the 2-process checkpoint bit for bit reading about a
    quarter each, train one more epoch, and each of the four parts holds about a quarter of the state."""
    ck_src, _, want, _ = dp2
    ck = tmp_path / "ck"
    shutil.copytree(ck_src, ck, symlinks=True)
    env = {"JAX_NUM_CPU_DEVICES": "1"}
    job = JaxJob(tmp_path, "q", "dp", ck, EPOCHS + 1, n=4, extra=dict.fromkeys(range(4), WIDE), env=env,
                 timeout_s=2 * _bound(dp2))  # fmt: skip
    job.succeed()
    where = ck / "ckpts" / "epochs" / f"{EPOCHS:03d}"
    _, state = _shares(where)
    total = sum(f.stat().st_size for f in where.iterdir())
    loads = [_stats(job, i)["load"] for i in range(4)]
    for i in range(4):
        assert job.restored_epoch(i) == EPOCHS
        assert _same(job.restored(i), want[0]) == [], f"process {i}"
        assert abs(loads[i]["slice_bytes"] - state / 4) <= 16 * 1024 + 64, i
        assert loads[i]["in_place_bytes"] == 0, i  # another process count: slices copied out of mapped parts
        assert loads[i]["read_bytes"] < 0.75 * total, loads  # each part's CRC is checked by one process only
    assert sum(load["read_bytes"] for load in loads) < 2 * total, loads
    shares, state = _shares(ck / "ckpts" / "epochs" / f"{EPOCHS + 1:03d}")
    assert len(shares) == 4 and sum(shares) == state
    for share in shares:
        assert abs(share - state / 4) <= 16 * 1024 + 64, (shares, state)


def test_kill9_then_rerun_is_bit_identical(dp2, tmp_path):
    """kill -9 of process 1 in epoch 2: the rerun resumes epoch 1 from the sliced checkpoint and ends as dp2."""
    _, _, want, _ = dp2
    ck, bound = tmp_path / "ck", _bound(dp2)
    job = JaxJob(tmp_path, "k", "dp", ck, EPOCHS, extra={0: WIDE, 1: [*WIDE, "--pause-at=1:1"]}, timeout_s=bound)
    job.wait_for(1, "PAUSED")
    job.kill(1)
    job.kill()
    rerun = JaxJob(tmp_path, "k2", "dp", ck, EPOCHS, extra={0: WIDE, 1: WIDE}, timeout_s=bound)
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in (0, 1)] == [1, 1]
    for i in (0, 1):
        assert _same(rerun.final(i), want[i]) == [], f"process {i}"


def test_model_parallel_restores_the_sliced_checkpoint(dp2, tmp_path):
    """Elastic to another mesh: ModelParallel over the same 2 processes restores the DataParallel slices."""
    ck_src, _, want, _ = dp2
    ck = tmp_path / "ck"
    shutil.copytree(ck_src, ck, symlinks=True)
    job = JaxJob(tmp_path, "m", "mp", ck, EPOCHS, extra={0: WIDE, 1: WIDE}, timeout_s=_bound(dp2))
    job.succeed()
    for i in (0, 1):
        assert job.restored_epoch(i) == EPOCHS
        assert _same(job.restored(i), want[0]) == [], f"process {i}"


def test_tensorflow_restores_and_consolidates_a_two_process_jax_checkpoint(dp2, tmp_path):
    """Cross-backend: one TensorFlow process restores the JAX job's checkpoint (Adam's int32 iteration into TF's
    int64) with restart() and trains on; consolidate under TensorFlow writes a model.keras whose every weight
    and optimizer variable equals the JAX job's, bit for bit."""
    ck_src, _, want, _ = dp2
    ck = tmp_path / "ck"
    shutil.copytree(ck_src, ck, symlinks=True)
    tf = {"KERAS_BACKEND": "tensorflow"}
    out = tmp_path / "model.keras"
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", **tf)
    done = subprocess.run(
        [sys.executable, "-m", "candle_ckpt", "consolidate", str(ck), str(out)], env=env, capture_output=True,
        text=True, timeout=_bound(dp2),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {out}" in done.stdout
    job = JaxJob(tmp_path, "tf", "none", ck, EPOCHS + 1, n=1, extra={0: ["--hidden=8192"]}, env=tf,
                 timeout_s=_bound(dp2))  # fmt: skip
    job.succeed()
    assert job.restored_epoch(0) == EPOCHS
    restored = job.restored(0)
    assert _same(restored, want[0]) == []
    assert restored[next(k for k in restored if k.endswith(":adam/iteration"))].dtype == np.int64  # TF's own dtype
    import keras

    loaded = keras.models.load_model(out)
    got = [np.asarray(keras.ops.convert_to_numpy(v)) for v in [*loaded.weights, *loaded.optimizer.variables]]
    ref = [want[0][k] for k in sorted(want[0])]
    assert len(got) == len(ref)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert np.array_equal(a, b), f"variable {i}"


def test_jax_distributed_with_another_keras_backend_is_refused_at_once(dp2, tmp_path):
    """jax.distributed initialized, Keras on TensorFlow: restart() refuses on both processes, naming the fix."""
    job = JaxJob(tmp_path, "wrong", "none", tmp_path / "ck", 1, env={"KERAS_BACKEND": "tensorflow"},
                 timeout_s=_bound(dp2))  # fmt: skip
    codes = job.exit_codes()
    for i in (0, 1):
        assert codes[i] != 0
        assert (
            f"RuntimeError: jax.distributed is initialized (process {i} of 2) but Keras runs on tensorflow: "
            "set KERAS_BACKEND=jax before importing keras" in job.output(i)
        ), job.output(i)[-3000:]
    assert not (tmp_path / "ck" / "ckpts").exists()
