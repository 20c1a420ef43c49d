"""A multi-process JAX job at 4 and 8 processes (1 CPU device each): where the users of scale-out are.

The same job as ``test_jax_multiprocess.py`` (``jax_mp_job.py``: ``restart()`` before ``fit``, the callback
at its defaults, gloo collectives), with one CPU device per process and data that grows with the job, so
that every process keeps 4 steps of 8 rows per epoch: ``dp`` is DataParallel over the N processes, ``mp``
ModelParallel on a 2 x 2 mesh across 4 processes (the first kernel split over the ``model`` axis, each mesh
row feeding its own rows).

Tolerance: none. Every job ends with its weights and optimizer variables equal, bit for bit, to an
uninterrupted run of the same shape. Each shape's uninterrupted run is made once (a module cache) and
timed; every later wait is a multiple of that measured time, and a failed wait SIGKILLs every process.

What grows with N is counted from the uninterrupted runs: files per checkpoint, bytes of the largest part
and keys left in the coordination service under ``candle_ckpt/`` at the end (what issue 37's protocol and
replica-parallel saving bound; the code before them failed these tests: 63 keys at N = 4, process 0 writing
every byte).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob, differing  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real jobs of 4 and 8 processes (a minute or more each on 2 cores)
    pytest.mark.scale,  # .ci/run's scale pass
    # JAX processes whatever this process runs: they run once, in the JAX scale pass of .ci/run.
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in a JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 3
ROWS_PER_PROCESS = 32  # 4 steps of 8 rows per epoch, whatever N
BASE_FILES = ["ckpt-info.json", "config.json", "manifest.json", "metadata.json"]


@dataclass
class Reference:
    """An uninterrupted run: its checkpoint directory, every process's final arrays, wall time and keys left."""

    directory: Path
    finals: list[dict[str, np.ndarray]]
    took: float
    keys: list[str]

    def bound(self) -> float:
        """The wait allowed for one job of this shape: several reference runs (a busy machine), at least 120 s."""
        return max(120.0, 4 * self.took)


def flags(n: int, dist: str, **per_rank: list[str]) -> dict[int, list[str]]:
    """Every rank's job flags for a run of ``n`` processes; ``per_rank['r3']``: more flags for rank 3."""
    common = [f"--rows={ROWS_PER_PROCESS * n}"] if dist == "dp" else ["--mesh=2,2", f"--rows={ROWS_PER_PROCESS * 2}"]
    return {i: common + per_rank.get(f"r{i}", []) for i in range(n)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(n, dist)``: the uninterrupted run of that shape, made on first use (each shape once)."""
    made: dict[tuple[int, str], Reference] = {}

    def get(n: int, dist: str = "dp") -> Reference:
        if (n, dist) not in made:
            tmp = tmp_path_factory.mktemp(f"ref-{dist}{n}")
            keys = tmp / "keys.json"
            extra = {i: f + [f"--keys-out={keys}"] for i, f in flags(n, dist).items()}  # every rank meets; 0 writes
            # Nothing measured yet: the first run of a shape may take 2 minutes per process on a loaded 2-core box.
            job = JaxJob(tmp, "ref", dist, tmp / "ck", EPOCHS, n=n, extra=extra, devices=1, timeout_s=120 * n)
            took = job.succeed()
            finals = [job.final(i) for i in range(n)]
            made[n, dist] = Reference(tmp / "ck", finals, took, json.loads(keys.read_text())["keys"])
        return made[n, dist]

    return get


def epoch_dir(ck: Path, epoch: int = EPOCHS) -> Path:
    return ck / "ckpts" / "epochs" / f"{epoch:03d}"


def assert_all_equal(job: JaxJob, n: int, want: list[dict[str, np.ndarray]], what: str = "final") -> None:
    """Every process's final (or restored) arrays equal ``want``'s, bit for bit."""
    for i in range(n):
        got = job.final(i) if what == "final" else job.restored(i)
        assert differing(got, want[i]) == [], f"process {i} of {n}"


def state_bytes(manifest: dict) -> int:
    """The bytes of every saved variable (the model's weights and the optimizer's), from the manifest."""
    return sum(
        math.prod(v["global_shape"]) * np.dtype(v["dtype"]).itemsize for v in manifest["variables"].values()
    )  # fmt: skip


@pytest.mark.parametrize("n", [4, 8])
def test_files_per_checkpoint_grow_by_three_per_process(reference, n):
    """One checkpoint of N processes holds 4 shared files plus, per process, a part, its index and its loop
    state; the parts together hold the state once (no value written twice)."""
    ref = reference(n)
    epoch = epoch_dir(ref.directory)
    names = sorted(p.name for p in epoch.iterdir())
    per_process = [f"part-{i:05d}.bin" for i in range(n)] + [f"part-{i:05d}.json" for i in range(n)]
    per_process += [f"train.state.p{i:05d}.npz" for i in range(n)]
    assert names == sorted(BASE_FILES + per_process), names
    manifest = json.loads((epoch / "manifest.json").read_text())
    written = sum(p["size"] for p in manifest["parts"])
    assert state_bytes(manifest) <= written <= state_bytes(manifest) + 64 * len(manifest["variables"])
    side = json.loads((epoch / "ckpt-info.json").read_text())
    assert set(side["files"]) == set(names) - {"ckpt-info.json"}
    print(f"N={n}: {len(names)} files per checkpoint; parts {[p['size'] for p in manifest['parts']]} bytes")


@pytest.mark.parametrize("n", [4, 8])
def test_no_process_writes_much_more_than_its_share(reference, n):
    """DataParallel: the largest part holds about 1/N of the state (64 bytes per variable of rounding)."""
    manifest = json.loads((epoch_dir(reference(n).directory) / "manifest.json").read_text())
    largest = max(p["size"] for p in manifest["parts"])
    assert largest <= state_bytes(manifest) / n + 64 * len(manifest["variables"]), manifest["parts"]


@pytest.mark.parametrize("n", [4, 8])
def test_keys_left_are_counted(reference, n):
    """The keys under ``candle_ckpt/`` left in the coordination service are all ours and name a meeting."""
    keys = reference(n).keys
    assert keys and all(k.startswith("candle_ckpt/") for k in keys)
    print(f"N={n}: {len(keys)} keys left under candle_ckpt/ after {EPOCHS} epochs of 4 steps")


@pytest.mark.parametrize("n", [4, 8])
def test_keys_left_stay_within_4n(reference, n):
    """At the end of a run the coordination service holds at most 4N keys of ours, whatever the steps."""
    keys = reference(n).keys
    assert len(keys) <= 4 * n, f"{len(keys)} keys: {keys[:12]} ..."


@pytest.mark.parametrize("n", [4])
def test_no_key_is_posted_per_step(reference, n):
    """No key names a training step: the preemption check costs no message per step."""
    keys = reference(n).keys
    assert not [k for k in keys if k.startswith("candle_ckpt/preempt/")], keys[:12]


@pytest.mark.parametrize("n", [4, 8])
def test_kill9_of_a_random_rank_mid_epoch_then_rerun_is_bit_identical(reference, tmp_path, n):
    """kill -9 of one process (any rank) in epoch 2; the rerun resumes epoch 1 everywhere and ends as the
    uninterrupted run on every process."""
    ref = reference(n)
    victim = random.randrange(n)
    ck = tmp_path / "ck"
    job = JaxJob(tmp_path, "a", "dp", ck, EPOCHS, n=n, devices=1, timeout_s=ref.bound(),
                 extra=flags(n, "dp", **{f"r{victim}": ["--pause-at=1:1"]}))  # fmt: skip
    job.wait_for(victim, "PAUSED")
    job.kill(victim)
    job.kill()  # the others wait in a collective for their dead peer: the test ends them
    rerun = JaxJob(tmp_path, "b", "dp", ck, EPOCHS, n=n, devices=1, extra=flags(n, "dp"), timeout_s=ref.bound())
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in range(n)] == [1] * n, f"victim {victim}"
    assert_all_equal(rerun, n, ref.finals)


@pytest.mark.parametrize("n", [4, 8])
def test_sigterm_to_the_last_rank_saves_one_step_everywhere_then_rerun_is_bit_identical(reference, tmp_path, n):
    """SIGTERM to rank N-1 only: every process commits the same step checkpoint (recorded as SIGTERM), says so
    naming rank N-1 as the one asked, and exits 143; the rerun ends bit-identical."""
    ref, last = reference(n), n - 1
    ck = tmp_path / "ck"
    job = JaxJob(tmp_path, "t", "dp", ck, EPOCHS, n=n, devices=1, timeout_s=ref.bound(),
                 extra=flags(n, "dp", **{f"r{last}": ["--pause-at=1:1:3"]}))  # fmt: skip
    job.wait_for(last, "PAUSED")
    job.signal(last, signal.SIGTERM)
    codes = job.exit_codes()
    assert codes == [143] * n, [job.output(i)[-2000:] for i in range(n) if codes[i] != 143]
    steps = sorted((ck / "ckpts" / "steps").iterdir())
    assert len(steps) == 1
    side = json.loads((steps[0] / "ckpt-info.json").read_text())
    assert side["epoch"] == 1 and side["step"] >= 2 and side["reason"] == "SIGTERM"
    assert {f"part-{i:05d}.bin" for i in range(n)} | {f"train.state.p{i:05d}.npz" for i in range(n)} <= set(
        side["files"]
    )
    for i in range(n):
        by = "" if i == last else f" at process {last}'s request"
        said = f"SIGTERM: process {i} committed {steps[0]}{by} (epoch 2, step {side['step']})"
        assert said in job.output(i) and "exiting with status 143" in job.output(i), job.output(i)[-2000:]
    rerun = JaxJob(tmp_path, "u", "dp", ck, EPOCHS, n=n, devices=1, extra=flags(n, "dp"), timeout_s=ref.bound())
    rerun.succeed()
    assert_all_equal(rerun, n, ref.finals)


@pytest.mark.parametrize("n", [4, 8])
def test_a_corrupted_part_makes_every_process_fall_back_together(reference, tmp_path, n):
    """A damaged part of the newest checkpoint (a random one of those holding bytes): every process resumes
    the checkpoint before it, the log says why, and every process ends bit-identical."""
    ref = reference(n)
    ck = tmp_path / "ck"
    shutil.copytree(ref.directory, ck, symlinks=True)
    parts = [p for p in sorted(epoch_dir(ck).glob("part-*.bin")) if p.stat().st_size > 0]
    part = random.choice(parts)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    job = JaxJob(tmp_path, "c", "dp", ck, EPOCHS, n=n, devices=1, extra=flags(n, "dp"), timeout_s=ref.bound())
    job.succeed()
    assert [job.restored_epoch(i) for i in range(n)] == [EPOCHS - 1] * n, part.name
    log = (ck / "ckpt.log").read_text()
    assert f"skipping epoch {EPOCHS}" in log and f"{part.name}: CRC32 is" in log
    assert_all_equal(job, n, ref.finals)


@pytest.mark.parametrize("src, dst", [(8, 2), (2, 8)])
def test_elastic_restore_between_2_and_8_processes_is_bit_identical(reference, tmp_path, src, dst):
    """A DataParallel checkpoint of ``src`` processes restores into ``dst`` processes: every process's model
    and optimizer equal the writing run's, bit for bit."""
    ref = reference(src)
    ck = tmp_path / "ck"
    shutil.copytree(ref.directory, ck, symlinks=True)
    started = time.monotonic()
    job = JaxJob(tmp_path, "e", "dp", ck, EPOCHS, n=dst, devices=1, extra=flags(dst, "dp"),
                 timeout_s=max(ref.bound(), 60.0 * dst))  # fmt: skip
    job.succeed()
    assert [job.restored_epoch(i) for i in range(dst)] == [EPOCHS] * dst
    assert_all_equal(job, dst, [ref.finals[0]] * dst, what="restored")
    print(f"{src} -> {dst}: {time.monotonic() - started:.1f} s")


def test_model_parallel_on_a_2x2_mesh_across_4_processes_kill9_then_rerun(reference, tmp_path):
    """ModelParallel, 2 x 2 mesh over 4 processes: the kernel's halves come from two processes; kill -9 of a
    random rank mid-epoch, then the rerun ends bit-identical on all four."""
    ref = reference(4, "mp")
    manifest = json.loads((epoch_dir(ref.directory) / "manifest.json").read_text())
    kernel = manifest["variables"]["dense_a/kernel"]
    assert len({c["part"] for c in kernel["chunks"]}) >= 2  # two processes hold different halves
    victim = random.randrange(4)
    ck = tmp_path / "ck"
    job = JaxJob(tmp_path, "a", "mp", ck, EPOCHS, n=4, devices=1, timeout_s=ref.bound(),
                 extra=flags(4, "mp", **{f"r{victim}": ["--pause-at=1:1"]}))  # fmt: skip
    job.wait_for(victim, "PAUSED")
    job.kill(victim)
    job.kill()
    rerun = JaxJob(tmp_path, "b", "mp", ck, EPOCHS, n=4, devices=1, extra=flags(4, "mp"), timeout_s=ref.bound())
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in range(4)] == [1] * 4, f"victim {victim}"
    assert_all_equal(rerun, 4, ref.finals)


@pytest.mark.parametrize("n", [4, 8])
def test_one_rank_hung_ends_every_process_with_124_then_rerun_is_bit_identical(reference, tmp_path, n):
    """Rank N-1 hangs in epoch 2, alive (its heartbeat going), with a limit 3x the others': every process exits
    124 (none aborted by JAX when process 0, the service's host, exits: it leaves last), the hung one naming
    the process that found the hang; the rerun ends bit-identical."""
    ref, last = reference(n), n - 1
    timeout = max(30.0, ref.took / 2)  # above any step of this shape here, whatever the load
    ck = tmp_path / "ck"
    stuck = [f"--hang-timeout={3 * timeout:.0f}", "--pause-at=1:1:900"]
    extra = flags(n, "dp", **{f"r{i}": [f"--hang-timeout={timeout:.0f}"] for i in range(last)}, **{f"r{last}": stuck})
    job = JaxJob(tmp_path, "h", "dp", ck, EPOCHS, n=n, devices=1, timeout_s=ref.bound() + 3 * timeout, extra=extra)
    job.wait_for(last, "PAUSED")
    codes = job.exit_codes()
    assert codes == [124] * n, [(i, job.output(i)[-2000:]) for i in range(n) if codes[i] != 124]
    for i in range(n):
        assert f"ERROR hang: process {i} of {n}" in job.output(i), job.output(i)[-2000:]
    assert "found the job hung first" in job.output(last), job.output(last)[-2000:]
    rerun = JaxJob(tmp_path, "i", "dp", ck, EPOCHS, n=n, devices=1, extra=flags(n, "dp"), timeout_s=ref.bound())
    rerun.succeed()
    assert_all_equal(rerun, n, ref.finals)
