"""The store's own writer lock: held by the store object that took it, released with it (close, ``with``,
garbage collection), and two stores of one process exclude each other as two processes do."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import pytest

from candle_ckpt.core.errors import CheckpointError, DirectoryLocked
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.store import CheckpointStore, FileSpec


def _commit(store: CheckpointStore, epoch: int) -> None:
    side = Sidecar(epoch=epoch, generation=0, model_file="w.bin", files={})
    store.commit(epoch, [FileSpec("w.bin", lambda f: f.write(b"w"))], side)


def test_two_stores_of_one_process_exclude_each_other_like_two_processes(tmp_path) -> None:
    """A second store on a directory held by a first one (same process) is refused, naming this process."""
    first = CheckpointStore(tmp_path)
    first.open_for_write()
    second = CheckpointStore(tmp_path)
    with pytest.raises(DirectoryLocked, match=r"another writer in this same process.*call its close\(\)"):
        second._lock.acquire(wait_same_process_s=0)
    first.close()
    second.open_for_write()
    assert second.is_open and not first.is_open
    second.close()


def test_close_and_the_context_manager_release_the_lock(tmp_path) -> None:
    """close() releases the lock; a `with` block releases it on the way out, also on an error."""
    with pytest.raises(RuntimeError, match="inside"):
        with CheckpointStore(tmp_path) as store:
            store.open_for_write()
            raise RuntimeError("inside the with block")
    assert not store.is_open
    other = CheckpointStore(tmp_path)
    other.open_for_write()
    other.close()
    other.close()  # closing twice is fine


def test_a_forgotten_store_releases_its_lock_when_collected(tmp_path) -> None:
    """The lock lives exactly as long as the store object that took it."""
    store = CheckpointStore(tmp_path)
    store.open_for_write()
    del store
    gc.collect()
    again = CheckpointStore(tmp_path)
    again.open_for_write()
    again.close()


def test_commit_needs_the_lock_and_a_reopened_store_continues_the_generation(tmp_path) -> None:
    """After close() a commit is refused; open_for_write() again continues after commits made meanwhile."""
    store = CheckpointStore(tmp_path)
    store.open_for_write()
    _commit(store, 1)
    store.close()
    with pytest.raises(CheckpointError, match="open_for_write"):
        _commit(store, 2)
    with CheckpointStore(tmp_path) as other:
        other.open_for_write()
        _commit(other, 2)
    store.open_for_write()
    _commit(store, 3)
    store.close()
    assert [store.read_sidecar(e).generation for e in (1, 2, 3)] == [1, 2, 3]


_HOLDER = """
import os, sys, time
from candle_ckpt.storage.store import CheckpointStore
store = CheckpointStore(sys.argv[1])
store.open_for_write()
child = os.fork()
if child == 0:  # a pool's worker: outlives its parent (killed by the test when done); os.fork ran its hooks
    open(os.path.join(sys.argv[1], "child-runs"), "w").close()
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
time.sleep(120)
"""


def test_a_killed_writers_forked_child_does_not_keep_the_lock(tmp_path) -> None:
    """A child forked while the lock is held (a multiprocessing pool's worker reading a PyDataset) shares the lock's
    open file; once the writer is killed the directory is free although the child lives on. Before, the child's
    copy kept the flock, and the requeued job was refused while a killed job's worker lingered (CI: a PyDataset
    read by forked processes, killed with SIGKILL, then resumed)."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        child = int(holder.stdout.readline())
        for _ in range(6000):  # the child's word that it runs (60 s at most)
            if (tmp_path / "child-runs").exists():
                break
            time.sleep(0.01)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
        os.kill(child, 0)  # the child lives on
        store = CheckpointStore(tmp_path)
        store._lock.acquire(wait_same_process_s=0)
        assert store._lock.held
        store.close()
    finally:
        holder.kill()
        holder.wait(timeout=60)
        if child:
            os.kill(child, signal.SIGKILL)
