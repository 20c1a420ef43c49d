"""A multi-process JAX job whose fast tier is each node's own disk, draining into one persistent tier.

Every job is 2 processes x 2 CPU devices (gloo, ``jax_mp_job.py``, DataParallel, the callback's defaults,
``shuffle=True``, a Dropout layer). ``--node-local`` gives each process its own ``ckpt_directory``
(``ck/node0``, ``ck/node1``: two "nodes" on one machine); both drain into ``ck/P`` (``ckpt_persistent_url``).
Final weights and optimizer variables are compared bit for bit with an uninterrupted job of the same
shape. Waits are bounded by a multiple of the measured uninterrupted run; a failed wait kills every process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

pytest.importorskip("jax")
from jax_cluster import JaxJob, differing  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # real multi-process jobs (tens of seconds each)
    pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="runs in the JAX pass (KERAS_BACKEND=jax)"),
]

EPOCHS = 3


def _flags(ck) -> list[str]:
    return ["--node-local", f"--persistent={ck / 'P'}"]


def _job(tmp, name, ck, bound, extra=None) -> JaxJob:
    extra = extra or {}
    flags = {i: _flags(ck) + extra.get(i, []) for i in (0, 1)}
    return JaxJob(tmp, name, "dp", ck, EPOCHS, extra=flags, timeout_s=bound)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The uninterrupted job: its directory, final arrays and a bound on one job's wait."""
    tmp = tmp_path_factory.mktemp("twin")
    job = _job(tmp, "twin", tmp / "ck", 600)
    took = job.succeed()
    return tmp / "ck", [job.final(0), job.final(1)], max(90.0, 4 * took)


def _wait_file(job: JaxJob, path, bound: float) -> None:
    """Wait until ``path`` exists; kill the job and fail after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not path.exists():
        if time.monotonic() > deadline:
            job.kill()
            pytest.fail(f"{path} never appeared:\n{job.output(0)[-3000:]}")
        time.sleep(0.1)


def _published(ck, epoch: int):
    return ck / "P" / "epochs" / f"{epoch:03d}" / "ckpt-info.json"


def _interrupt(tmp, ck, bound, name: str, pause: str) -> None:
    """Run until process 1 pauses at ``pause`` (epoch:batch) and its last epoch is published; kill -9 both."""
    job = _job(tmp, name, ck, bound, {1: [f"--pause-at={pause}"]})
    job.wait_for(1, "PAUSED")
    _wait_file(job, _published(ck, int(pause.split(":")[0])), bound)  # epochs before the paused one are drained
    job.kill(1)
    job.kill()  # the survivor waits in a collective for its dead peer: the test ends it


def _same_as_twin(job: JaxJob, want) -> None:
    for i in (0, 1):
        assert differing(job.final(i), want[i]) == [], f"process {i}"


def test_each_node_holds_its_part_and_the_persistent_tier_every_part(twin):
    """Node-local copies hold the manifest and their own part; the persistent tier one archive per process, the
    manifest and the sidecar (N + 2 files) listing every process's files."""
    ck, _, _ = twin
    last = f"{EPOCHS:03d}"
    node1 = sorted(p.name for p in (ck / "node1" / "ckpts" / "epochs" / last).iterdir())
    assert node1 == ["ckpt-info.json", "manifest.json", "part-00001.bin", "part-00001.json", "train.state.p00001.npz"]
    node0 = sorted(p.name for p in (ck / "node0" / "ckpts" / "epochs" / last).iterdir())
    assert "part-00000.bin" in node0 and "part-00001.bin" not in node0
    persistent = sorted(p.name for p in (ck / "P" / "epochs" / last).iterdir())
    archives = [f"part-0000{i}.g{EPOCHS:06d}.tar" for i in (0, 1)]
    assert persistent == ["ckpt-info.json", "manifest.json", *archives]
    side = json.loads((ck / "P" / "epochs" / last / "ckpt-info.json").read_text())
    assert {"part-00000.bin", "part-00001.bin", "train.state.p00001.npz", "config.json"} <= set(side["files"])
    local = [json.loads((ck / f"node{i}" / "ckpts" / "epochs" / last / "ckpt-info.json").read_text()) for i in (0, 1)]
    assert local[0]["generation"] == local[1]["generation"] == side["generation"]
    assert local[0]["lineage"] == local[1]["lineage"] == side["lineage"]


def test_kill9_one_rank_resumes_from_the_fast_tiers(twin, tmp_path):
    """kill -9 of process 1 in epoch 2: the rerun resumes epoch 1 from each node's own copy, bit-identical."""
    _, want, bound = twin
    ck = tmp_path / "ck"
    _interrupt(tmp_path, ck, bound, "a", "1:1")
    rerun = _job(tmp_path, "b", ck, bound)
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in (0, 1)] == [1, 1]
    assert "restart: tier: fast: the fast tiers' epochs/001" in (ck / "node0" / "ckpt.log").read_text()
    assert "pulled" not in rerun.output(1)
    _same_as_twin(rerun, want)


def test_one_node_lost_everyone_restores_from_the_persistent_tier(twin, tmp_path):
    """Process 1's directory is gone (a new node): both restore from the persistent tier, bit-identical, and
    the log says why."""
    _, want, bound = twin
    ck = tmp_path / "ck"
    _interrupt(tmp_path, ck, bound, "a", "2:1")
    shutil.rmtree(ck / "node1")
    rerun = _job(tmp_path, "b", ck, bound)
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in (0, 1)] == [2, 2]
    log = (ck / "node0" / "ckpt.log").read_text()
    assert "restart: tier: persistent: " in log and "epochs/002 (generation 2, epoch 2) is newer than" in log
    assert "no checkpoint is held by every process" in log and "process 1: nothing" in log
    assert "process 1 pulled its part of epochs/002" in rerun.output(1) or (ck / "node1" / "ckpts").is_dir()
    _same_as_twin(rerun, want)


def test_a_stale_node_loses_to_the_persistent_tier(twin, tmp_path):
    """Process 1's directory is an older copy (a node that ran this job before): the persistent tier's newer
    checkpoint wins over the newest one both nodes hold, bit-identical."""
    _, want, bound = twin
    ck = tmp_path / "ck"
    _interrupt(tmp_path, ck, bound, "a", "1:1")
    shutil.copytree(ck / "node1", tmp_path / "node1-epoch1", symlinks=True)
    _interrupt(tmp_path, ck, bound, "b", "2:1")
    shutil.rmtree(ck / "node1")
    shutil.copytree(tmp_path / "node1-epoch1", ck / "node1", symlinks=True)
    rerun = _job(tmp_path, "c", ck, bound)
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in (0, 1)] == [2, 2]
    log = (ck / "node0" / "ckpt.log").read_text()
    assert "restart: tier: persistent: " in log
    assert "epochs/002 (generation 2, epoch 2) is newer than the fast tiers' epochs/001" in log
    _same_as_twin(rerun, want)


def test_no_sidecar_until_every_part_is_in(twin, tmp_path):
    """Process 1 drains only at the end (``ckpt_drain=end``): the primary's archive of epoch 1 is in the
    persistent tier, but no sidecar: without every part, the checkpoint is not published (and the primary's
    drain, in commit order, waits on it: epoch 2 is not published either)."""
    _, _, bound = twin
    ck = tmp_path / "ck"
    job = _job(tmp_path, "a", ck, bound, {1: ["--drain=end", "--pause-at=2:1"]})
    job.wait_for(1, "PAUSED")
    _wait_file(job, ck / "P" / "epochs" / "001" / "part-00000.g000001.tar", bound)
    time.sleep(1.0)  # the primary's drain polls for process 1's archive meanwhile
    names = sorted(p.name for p in (ck / "P" / "epochs" / "001").iterdir())
    job.kill(1)
    job.kill()
    assert names == ["part-00000.g000001.tar"], names
    assert not _published(ck, 2).exists()


def test_sigterm_saves_and_drains_a_step_checkpoint_on_every_node(twin, tmp_path):
    """SIGTERM to process 1: each process commits the same step checkpoint on its own disk and drains its part
    before exiting 143 (not 75: drained); the persistent tier publishes it; with node 1's directory then gone,
    the rerun resumes that step from the persistent tier, bit-identical."""
    _, want, bound = twin
    ck = tmp_path / "ck"
    job = _job(tmp_path, "t", ck, bound, {1: ["--pause-at=1:1:3"]})
    job.wait_for(1, "PAUSED")
    job.signal(1, signal.SIGTERM)
    assert job.exit_codes() == [143, 143], [job.output(i)[-3000:] for i in (0, 1)]
    steps = [sorted((ck / f"node{i}" / "ckpts" / "steps").iterdir()) for i in (0, 1)]
    assert [len(s) for s in steps] == [1, 1] and steps[0][0].name == steps[1][0].name
    persistent = ck / "P" / "steps" / steps[0][0].name
    side = json.loads((persistent / "ckpt-info.json").read_text())
    assert side["reason"] == "SIGTERM" and side["epoch"] == 1 and side["step"] >= 2
    assert {"part-00000.bin", "part-00001.bin"} <= set(side["files"])
    for i in (0, 1):
        assert "and drained it to the persistent tier" in job.output(i), job.output(i)[-3000:]
    shutil.rmtree(ck / "node1")
    rerun = _job(tmp_path, "u", ck, bound)
    rerun.succeed()
    assert "restart: tier: persistent: " in (ck / "node0" / "ckpt.log").read_text()
    _same_as_twin(rerun, want)


@pytest.mark.scale  # 4 processes of one CPU device: .ci/run's scale pass
def test_four_processes_one_node_lost(tmp_path):
    """4 processes (1 device each), each its own directory: N + 2 = 6 persistent files per checkpoint; process 3
    killed and its directory gone: all 4 restore from the persistent tier, bit-identical to the uninterrupted job."""
    n, rows = 4, ["--rows=128"]

    def job(name: str, ck, bound: float, more=None) -> JaxJob:
        extra = {i: _flags(ck) + rows + (more or {}).get(i, []) for i in range(n)}
        return JaxJob(tmp_path, name, "dp", ck, EPOCHS, n=n, extra=extra, devices=1, timeout_s=bound)

    twin = job("twin", tmp_path / "twin", 120 * n)
    bound = max(120.0, 4 * twin.succeed())
    want = [twin.final(i) for i in range(n)]
    last = tmp_path / "twin" / "P" / "epochs" / f"{EPOCHS:03d}"
    assert len(list(last.iterdir())) == n + 2
    ck = tmp_path / "ck"
    first = job("a", ck, bound, {3: ["--pause-at=2:1"]})
    first.wait_for(3, "PAUSED")
    _wait_file(first, _published(ck, 2), bound)
    first.kill(3)
    first.kill()
    shutil.rmtree(ck / "node3")
    rerun = job("b", ck, bound)
    rerun.succeed()
    assert [rerun.restored_epoch(i) for i in range(n)] == [2] * n
    log = (ck / "node0" / "ckpt.log").read_text()
    assert "restart: tier: persistent: " in log and "process 3: nothing" in log
    for i in range(n):
        assert differing(rerun.final(i), want[i]) == [], f"process {i} of {n}"
