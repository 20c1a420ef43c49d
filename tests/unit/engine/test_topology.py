"""The engine's topology (engine/topology.py): got from the Group, it alone says who commits and what the others
write; the engine's save path is the same for all three shapes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.group import SOLO
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.topology import MirroredWorkers, SharedParts, Topology, mirrored, parts_of
from candle_ckpt.storage.store import CheckpointStore, FileSpec
from candle_ckpt.testing.groups import ThreadGroup


def capture() -> Capture:
    return Capture(files=[FileSpec("model.bin", lambda f: f.write(b"weights"))], model_file="model.bin", nbytes=7)


def config(tmp_path: Path) -> CkptConfig:
    params = {"ckpt_directory": str(tmp_path / "run"), "ckpt_save_interval": 1, "ckpt_async": False}
    return CkptConfig.from_params({**params, "ckpt_deadline": "none"}).resolved()


def test_each_shape_says_who_commits_and_whether_the_saves_meet() -> None:
    """One process commits alone; of a group's parts only the primary publishes and the saves meet; of mirrored
    workers the chief (the group's primary) commits and the saves never meet (their group is SOLO)."""
    first, second = ThreadGroup(2).members
    one = parts_of(SOLO)
    assert type(one) is Topology and one.primary and not one.meets and one.scratch_dir is None
    shared = [parts_of(first), parts_of(second)]
    assert all(isinstance(t, SharedParts) and t.meets for t in shared)
    assert [t.primary for t in shared] == [True, False]
    chief, worker = mirrored(first, "/scratch/0"), mirrored(second, "/scratch/1")
    assert isinstance(worker, MirroredWorkers) and worker.workers is second
    assert (chief.primary, chief.scratch_dir) == (True, None)
    assert (worker.primary, worker.scratch_dir) == (False, "/scratch/1")
    assert chief.group is SOLO and worker.group is SOLO and not worker.meets


def test_a_mirrored_worker_saves_its_scratch_copy_and_commits_nothing(tmp_path: Path) -> None:
    """A non-chief worker's engine decides and snapshots as the chief's does, writes its scratch copy, removes it,
    and never opens, commits to or logs in the store; the chief's engine commits the same epoch."""
    cfg = config(tmp_path)
    first, second = ThreadGroup(2).members
    scratch = str(tmp_path / "run" / "ckpts" / ".tmp-worker-1")
    worker = CheckpointEngine(cfg, OpsLog(None), topology=mirrored(second, scratch))
    assert worker.scratch_dir == scratch and worker.group is SOLO
    assert worker.save(1, {"val_loss": 1.0}, capture)
    assert worker.save_step(1, 3, {}, capture, "SIGTERM") is None
    worker.finish()
    assert worker.records == [] and not os.path.lexists(scratch)
    assert CheckpointStore(str(tmp_path / "run")).epochs() == []
    chief = CheckpointEngine(cfg, OpsLog(None), topology=mirrored(first, scratch))
    assert chief.save(1, {"val_loss": 1.0}, capture)
    chief.close()
    assert CheckpointStore(str(tmp_path / "run")).epochs() == [1]
    assert [r["epoch"] for r in chief.records] == [1]


def test_the_engines_shorthands_make_the_same_topologies(tmp_path: Path) -> None:
    """``group=`` is that group's parts and ``scratch_dir=`` a mirrored non-chief, as the front ends spelled them."""
    cfg = config(tmp_path)
    engine = CheckpointEngine(cfg, OpsLog(None))
    assert type(engine.topology) is Topology and engine.group is SOLO
    engine.close()
    scratch = CheckpointEngine(cfg, OpsLog(None), scratch_dir=str(tmp_path / "s"))
    assert isinstance(scratch.topology, MirroredWorkers) and not scratch.topology.primary


@pytest.mark.parametrize("size", [1, 3])
def test_parts_of_a_group_of_one_is_one_process(size: int) -> None:
    """The size of the group is asked once, where the topology is made: a group of one is one process."""
    member = ThreadGroup(size).members[0]
    assert isinstance(parts_of(member), SharedParts) == (size > 1)


def test_a_periodic_step_checkpoint_of_one_process_is_committed_by_the_writer_and_a_preemption_one_at_once(
    tmp_path: Path,
) -> None:
    """With asynchronous writes, one process's periodic step checkpoint (``background=True``) asks for a copy and is
    committed on the writer's thread, while the training thread goes on; a preemption's (``SIGTERM``) is captured
    uncopied and committed on the calling thread before save_step returns; ckpt_async=false commits both at once;
    shared parts keep their periodic ones on the training thread (their meetings are per commit)."""
    import threading

    from candle_ckpt.engine.writer import AsyncWriter

    def recording(asked: list, threads: list):
        def capture_step(copy: bool = False) -> Capture:
            asked.append(copy)

            def write(f) -> None:
                threads.append(threading.current_thread().name)
                f.write(b"weights")

            return Capture(files=[FileSpec("model.bin", write)], model_file="model.bin", nbytes=7)

        return capture_step

    for async_save, expected in ((True, ["candle_ckpt-writer", "MainThread"]), (False, ["MainThread"] * 2)):
        params = {"ckpt_directory": str(tmp_path / str(async_save)), "ckpt_save_interval": 1}
        cfg = CkptConfig.from_params({**params, "ckpt_async": async_save, "ckpt_deadline": "none"}).resolved()
        engine = CheckpointEngine(cfg, OpsLog(None))
        assert isinstance(engine.writer, AsyncWriter) is async_save
        asked, threads = [], []
        periodic = engine.save_step(1, 3, {}, recording(asked, threads), "steps", background=True)
        assert (periodic is None) is async_save  # handed to the writer: nothing committed here yet
        preempted = engine.save_step(1, 5, {}, recording(asked, threads), "SIGTERM")
        assert preempted is not None and preempted.step == 5 and threads == expected, threads
        assert asked == [async_save, False]
        engine.finish()
        assert [(r["step"], r["reason"]) for r in engine.records] == [(3, "steps"), (5, "SIGTERM")]
        engine.close()
    first, _ = ThreadGroup(2).members
    assert not parts_of(first).background_steps and not mirrored(first, None).background_steps
    assert parts_of(SOLO).background_steps
