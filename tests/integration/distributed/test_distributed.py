"""Checkpoint/restart under tf.distribute, with real worker processes.

Every job runs in fresh processes (``dist_job.py``): MirroredStrategy needs
its logical devices configured before TensorFlow starts, and a
MultiWorkerMirroredStrategy cluster is two processes on localhost, each with
its own ``TF_CONFIG`` and gRPC server. Every wait is bounded; when a peer is
killed the survivors may hang in a collective, so the whole cluster is killed.

Tolerance: none. The final weights are compared bit for bit with an
uninterrupted run of the same cluster shape: with two replicas each gradient
element is the sum of two numbers, and a + b == b + a exactly, so the CPU
all-reduce is deterministic here (the tests would show it if it were not).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from cluster import WorkerCluster
from pace import wait_s

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]  # tf.distribute multi-worker training: real clusters

RUN_TIMEOUT_S = wait_s(140)  # one cluster run, scaled to the machine (pace); a hang fails instead of blocking CI
SURVIVOR_GRACE_S = 5  # after a kill, how long the survivors may take to exit on their own


class Cluster(WorkerCluster):
    """``n`` worker processes of ``dist_job.py`` (``n == 1``: no TF_CONFIG)."""

    def __init__(self, tmp: Path, name: str, kind: str, directory: Path, epochs: int, n: int, extra=None) -> None:
        super().__init__("dist_job.py", tmp, name, kind, directory, epochs, n, extra, timeout_s=RUN_TIMEOUT_S)

    def kill_when(self, i: int, marker: str) -> None:
        """Kill worker ``i`` with SIGKILL once it prints ``marker``, then the survivors."""
        self.wait_for(i, marker)
        self.kill(i)
        self.kill_after_peer_death()

    def kill_after_peer_death(self) -> None:
        """Give the survivors a moment to fail on their own, then kill them (collectives may hang)."""
        deadline = time.monotonic() + SURVIVOR_GRACE_S
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.kill()

    def wait(self) -> None:
        """Wait for every worker to finish successfully (bounded)."""
        for i, code in enumerate(self.exit_codes()):
            assert code == 0, f"worker {i} exited {code}:\n{self.output(i)[-3000:]}"
            assert "DONE" in self.output(i)

    def restored_epochs(self) -> list[int]:
        return [int(self.line(i, r"^RESTORED epoch=(\d+)").group(1)) for i in range(len(self.procs))]


def run_to_end(tmp: Path, name: str, kind: str, directory: Path, epochs: int, n: int) -> Cluster:
    cluster = Cluster(tmp, name, kind, directory, epochs, n)
    cluster.wait()
    return cluster


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def committed(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in (directory / "ckpts" / "epochs").iterdir())


def last_link(directory: Path) -> str:
    return os.readlink(directory / "ckpts" / "last")


def debris(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "ckpts").iterdir() if p.name.startswith((".tmp-", "work", "trash-")))


# -- MirroredStrategy, Keras 3 model.fit (one process, 2 logical CPUs) -------------------
def test_mirrored_fit_killed_mid_epoch_resumes_bit_identical(tmp_path: Path) -> None:
    """Keras 3 fit under MirroredStrategy: kill -9 in mid-epoch 3, restart, end equal to an uninterrupted run."""
    ref = run_to_end(tmp_path, "ref", "mirrored", tmp_path / "ref", 4, 1)
    run = Cluster(tmp_path, "run", "mirrored", tmp_path / "ckpt", 4, 1, extra={0: ["--pause-at", "2:1"]})
    run.wait_for(0, "PAUSED")
    run.kill()
    assert committed(tmp_path / "ckpt") == [1, 2]
    again = run_to_end(tmp_path, "again", "mirrored", tmp_path / "ckpt", 4, 1)
    assert again.restored_epochs() == [2]
    assert_same(again.final(0), ref.final(0))


# -- MultiWorkerMirroredStrategy: 2 worker processes on localhost --------------------------
def test_tf_keras_fit_worker_killed_mid_epoch_cluster_resumes_from_chief_checkpoint(tmp_path: Path) -> None:
    """tf_keras fit on 2 workers: kill -9 worker 1 in mid-epoch; the restarted cluster resumes
    from the chief's last commit, every worker loads identical weights, and ends equal to an uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    ref = Cluster(tmp_path, "ref", "tfk", tmp_path / "ref", 4, 2)  # runs alongside
    run = Cluster(tmp_path, "run", "tfk", ckpt, 4, 2, extra={1: ["--pause-at", "2:1"]})
    run.kill_when(1, "PAUSED")
    last = last_link(ckpt)
    assert last in ("epochs/002", "epochs/003")  # the chief may or may not have reached epoch 3's end
    assert not (ckpt / "ckpts" / "epochs" / "004").exists()
    assert not any((ckpt / "ckpts").glob(".tmp-worker-*"))  # the non-chief removed its scratch copy
    assert sorted(p.name for p in (ckpt / "ckpts" / "epochs" / "002").iterdir()) == [
        "ckpt-info.json",
        "model.h5",
        "model_weights.h5",
        "optimizer.npz",
        "train.state.npz",
    ]

    again = run_to_end(tmp_path, "again", "tfk", ckpt, 4, 2)
    assert again.restored_epochs() == [int(last[-3:])] * 2
    assert_same(again.restored(0), again.restored(1))
    ref.wait()
    for i in range(2):
        assert_same(again.final(i), ref.final(0))
    assert_same(ref.final(0), ref.final(1))


def test_keras3_job_runner_worker_killed_then_chief_killed_during_commit(tmp_path: Path) -> None:
    """Keras 3 custom loop on 2 workers through JobRunner(strategy=...) with async writes: kill worker 1
    inside its scratch save, restart, kill the chief inside a commit, restart; every restore loads the
    chief's last committed epoch (model, optimizer and loop state) on both workers, debris is ignored
    then removed, and the end equals an uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    ref = Cluster(tmp_path, "ref", "k3", tmp_path / "ref", 5, 2)  # runs alongside

    # 1. worker 1 dies while writing its scratch copy of epoch 2 (its 3rd save: epoch 0 is the first).
    run1 = Cluster(tmp_path, "run1", "k3", ckpt, 5, 2, extra={1: ["--pause-in-temp", "3"]})
    run1.kill_when(1, "IN-TEMP")
    assert (ckpt / "ckpts" / ".tmp-worker-1" / "model.weights.h5").exists()  # its debris
    last1 = last_link(ckpt)
    # The chief's commits race with the kill; async writes let both run one epoch ahead.
    assert last1 in ("epochs/001", "epochs/002", "epochs/003")

    # 2. the cluster restarts; the chief dies inside the commit of epoch 4.
    run2 = Cluster(tmp_path, "run2", "k3", ckpt, 5, 2, extra={0: ["--pause-in-commit", "4"]})
    run2.wait_for(0, "IN-COMMIT")
    assert run2.restored_epochs() == [int(last1[-3:])] * 2
    assert_same(run2.restored(0), run2.restored(1))
    work = ckpt / "ckpts" / "work"
    assert sorted(p.name for p in work.iterdir()) == ["ckpt-info.json", "loop_state.json", "model.weights.h5"]
    run2.kill(0)
    run2.kill_after_peer_death()
    assert last_link(ckpt) == "epochs/003"
    assert 4 not in committed(ckpt)

    # 3. the cluster restarts from epoch 3 and finishes (each worker checks its restored loop state).
    run3 = run_to_end(tmp_path, "run3", "k3", ckpt, 5, 2)
    assert run3.restored_epochs() == [3, 3]
    assert_same(run3.restored(0), run3.restored(1))
    assert debris(ckpt) == []
    assert last_link(ckpt) == "epochs/005"
    ref.wait()
    for i in range(2):
        assert_same(run3.final(i), ref.final(0))


# -- the one restore protocol (engine/group_restore.py) over tf_group ----------------------
def test_tf_keras_cluster_falls_back_together_when_a_worker_cannot_verify_the_newest(tmp_path: Path) -> None:
    """tf_keras fit on 2 workers, 3 epochs; restart where worker 1 reads epoch 3's weights file with a byte flipped
    (the chief's copy is intact): the chief chose epoch 3, worker 1's CRC check fails, the chief rejects it and
    both workers restore epoch 2, identical, and retrain epoch 3 bit-identical to the first run; the chief's
    ckpt.log says why epoch 3 was skipped."""
    ckpt = tmp_path / "ckpt"
    first = run_to_end(tmp_path, "first", "tfk", ckpt, 3, 2)
    assert last_link(ckpt) == "epochs/003"
    bad = ["--corrupt-read", "ckpts/epochs/003/model_weights.h5"]
    again = Cluster(tmp_path, "again", "tfk", ckpt, 3, 2, extra={1: bad})
    again.wait()
    assert "CORRUPT-READ" in again.output(1) and "CORRUPT-READ" not in again.output(0)
    assert again.restored_epochs() == [2, 2]
    assert_same(again.restored(0), again.restored(1))
    for i in range(2):
        assert_same(again.final(i), first.final(0))
    log = (ckpt / "ckpt.log").read_text()
    skipped = [line for line in log.splitlines() if "restart: skipping epoch 3: " in line]
    assert len(skipped) == 1 and "process 1: " in skipped[0] and "model_weights.h5" in skipped[0], log[-3000:]
    assert "restart: worker worker:0 resumed from " in log and "epochs/002" in log.split("resumed from ")[-1]


def test_tf_keras_cluster_restores_the_exact_epoch_asked_for_on_every_worker(tmp_path: Path) -> None:
    """ckpt_restart_epoch=1 under the one restore protocol: with epochs 1-3 on disk, both workers restore epoch 1
    (not the newest), identical, and retrain epochs 2-3 to the first run's weights bit for bit."""
    ckpt = tmp_path / "ckpt"
    first = run_to_end(tmp_path, "first", "tfk", ckpt, 3, 2)
    assert last_link(ckpt) == "epochs/003"
    again = Cluster(tmp_path, "again", "tfk", ckpt, 3, 2, extra={i: ["--restart-epoch", "1"] for i in range(2)})
    again.wait()
    assert again.restored_epochs() == [1, 1]
    assert_same(again.restored(0), again.restored(1))
    for i in range(2):
        assert_same(again.final(i), first.final(0))
    assert "epochs/001" in (ckpt / "ckpt.log").read_text().split("resumed from ")[-1]


@pytest.mark.parametrize("n", [2, 4])
def test_tf_restore_calls_and_keys_left(tmp_path: Path, n: int) -> None:
    """A tf.distribute restore of n workers (tf_keras restart() of a checkpoint): its calls to TensorFlow's
    coordination service are O(n) summed over the workers, and once every worker is past it the only keys it set
    that remain are the n per-rank scope counters (candle_ckpt/opened/R)."""
    ckpt = tmp_path / "ckpt"
    run_to_end(tmp_path, "seed", "tfk", ckpt, 1, 1)  # one checkpoint (epoch 1) to restore
    counted = Cluster(tmp_path, "count", "tfk", ckpt, 1, n, extra={i: ["--count"] for i in range(n)})
    counted.wait()
    assert counted.restored_epochs() == [1] * n
    reports = [json.loads(Path(str(out) + ".count.json").read_text()) for out in counted.outs]
    calls = sum(sum(r["calls"].values()) for r in reports)
    left = sorted(k for r in reports for k in r["left"])
    assert left == [f"candle_ckpt/opened/{r}" for r in range(n)], left
    assert calls <= 16 * n, (calls, [r["calls"] for r in reports])
    print(f"N={n}: restore {calls} calls ({calls / n:.1f} per worker), keys left {len(left)}")


_LONE_RESTORE = """
import json, os, sys, time
rank, p0, p1, d = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
workers = [f"localhost:{p0}", f"localhost:{p1}"]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
import tensorflow as tf
from candle_ckpt.core.errors import GroupTimeout
from candle_ckpt.distributed.worker_state import WorkerTrainingState

class Nothing:
    reads = ()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
done = os.path.join(d, "done")
if rank == 0:
    state = WorkerTrainingState({"ckpt_directory": d}, adapter=Nothing(), strategy=strategy, writable=False,
                                verbose=False, collective_timeout_s=3)
    try:
        state.restore()
    except GroupTimeout as err:
        print("T", err)
    open(done, "w").close()
else:  # never restores; stays in the cluster until worker 0 is done
    deadline = time.monotonic() + 120
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.1)
"""


def test_a_worker_that_never_restores_is_named_within_collective_timeout_s(tmp_path: Path) -> None:
    """2 workers, worker 1 never calls restore(): worker 0's restore raises GroupTimeout after its
    collective_timeout_s (3 s), naming the meeting point and rank 1."""
    from cluster import free_ports, run_pair

    script = tmp_path / "lone.py"
    script.write_text(_LONE_RESTORE)
    ports = [str(p) for p in free_ports(2)]
    args = [[str(i), *ports, str(tmp_path / "ckpt")] for i in (0, 1)]
    outs = run_pair(script, args, {"CUDA_VISIBLE_DEVICES": ""}, wait_s(90))
    assert "T the processes did not all reach 'restore/0/tiers' within 3 s (rank(s) 1 never came)" in outs[0], outs


_LONE_RESTART = """
import json, os, sys, time
rank, p0, p1, d = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
workers = [f"localhost:{p0}", f"localhost:{p1}"]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
import candle_ckpt as candle

keras = tf.keras  # tf_keras
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():  # on both: a variable's creation is a collective
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
print("BUILT", flush=True)
if rank == 0:
    candle.restart({"ckpt_directory": d, "ckpt_hang_timeout": float(sys.argv[5])}, model, verbose=False)
    print("RESTART RETURNED", flush=True)
else:  # never restarts (its set-up hangs); leaves once worker 0 said it ended, so the cluster's exit is not ours
    log, deadline = os.path.join(d, "ckpt.log"), time.monotonic() + float(sys.argv[6])
    while time.monotonic() < deadline and not (os.path.exists(log) and "exiting with status" in open(log).read()):
        time.sleep(0.2)
    sys.stdout.flush()
    os._exit(0)
"""


def test_restart_under_multi_worker_ends_with_124_when_a_worker_never_comes(tmp_path: Path) -> None:
    """restart() of a tf_keras model under MultiWorkerMirroredStrategy, worker 1 never calls it: worker 0 exits
    124 once the group's bound (CANDLE_CKPT_GROUP_TIMEOUT_S) runs out, naming the meeting point and rank 1, as a
    JAX group's restart() does. (Before, this path kept WorkerTrainingState's own 300 s, and at the defaults, where
    the restore's hang limit is 600 s, a GroupTimeout traceback ended the job with status 1: not requeued.)"""
    import subprocess

    from cluster import free_ports, run_procs

    script = tmp_path / "lone_restart.py"
    script.write_text(_LONE_RESTART)
    ckpt = tmp_path / "ckpt"
    group_s = wait_s(4.0)
    bound = 4 * group_s + 10 + wait_s(60)  # the hang timeout is 4x the group's; 10 s: process 0's hand-off
    env = {"CUDA_VISIBLE_DEVICES": "", "CANDLE_CKPT_GROUP_TIMEOUT_S": f"{group_s:.1f}"}
    ports = [str(p) for p in free_ports(2)]
    args = [[str(i), *ports, str(ckpt), f"{4 * group_s:.1f}", f"{bound:.0f}"] for i in (0, 1)]
    codes, (out0, out1) = run_procs(script, args, env, bound, stderr=subprocess.STDOUT)
    assert codes[0] == 124, out0[-3000:]
    assert "RESTART RETURNED" not in out0 and "GroupTimeout" not in out0, out0[-3000:]
    assert "BUILT" in out1, out1[-3000:]
    log = (ckpt / "ckpt.log").read_text()
    assert "hang: process 0 of 2 made no progress" in log and "in phase restore" in log, log[-3000:]
    assert "CANDLE_CKPT_GROUP_TIMEOUT_S" in log and "rank(s) 1 never came" in log, log[-3000:]
