"""Real processes killed with SIGKILL: during pruning, and while holding the writer lock.

The child processes use only the core (no keras) so that each starts fast;
the directory they work on holds real checkpoints from a Keras fit, and
``restart()`` is run on what each kill leaves.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from locations import FIGURES, REPO
from pace import wait_s
from pipe_lines import PipeLines
from testkit import build_model  # noqa: E402

from candle_ckpt.core.errors import DirectoryLocked
from candle_ckpt.core.fs import read_link
from candle_ckpt.keras.callback import CandleCheckpointCallback
from candle_ckpt.keras.restart import restart
from candle_ckpt.storage.store import CheckpointStore

ENV = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 8)).astype("float32")
Y = RNG.normal(size=(32, 1)).astype("float32")
EPOCHS, BEST, RESUMED, LAST = 8, 2, 4, 8

PRUNER = textwrap.dedent(
    """
    import os, sys
    from candle_ckpt.core.fs import LocalFS
    from candle_ckpt.core.retention import KeepLatest
    from candle_ckpt.storage.store import CheckpointStore

    class StepFS(LocalFS):
        # Announce each step and wait for the parent, which kills us before the step it chooses.
        def hook(self, op, path):
            print(op, path, flush=True)
            sys.stdin.readline()

        def rmtree(self, path):
            # one step per file, so that a kill can leave a half-deleted directory
            self.hook("rmtree", path)
            for dirpath, _, files in os.walk(path, topdown=False):
                for name in files:
                    self.hook("unlink", os.path.join(dirpath, name))
                    os.unlink(os.path.join(dirpath, name))
                self.hook("rmdir", dirpath)
                os.rmdir(dirpath)

    store = CheckpointStore(sys.argv[1], fs=StepFS())
    store.open_for_write()
    print("deleted", store.prune(KeepLatest(1).select, protected=[int(sys.argv[2])]), flush=True)
    """
)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Epochs 1..8 from a real fit; best moved to 2 so that best, last and the resumed-from epoch all differ."""
    root = tmp_path_factory.mktemp("prune") / "job"
    params = {"ckpt_directory": str(root), "epochs": EPOCHS, "ckpt_save_best_metric": "loss"}
    cb = CandleCheckpointCallback(params, logger=None, verbose=False)
    build_model(1).fit(X, Y, epochs=EPOCHS, batch_size=8, shuffle=False, verbose=0, callbacks=[cb])
    cb.engine.store.set_link("best", BEST)
    cb.engine.store.close()
    return root


def kill_pruner_at(root: Path, step: int | None) -> list[str]:
    """Run the pruner and SIGKILL it just before its ``step``-th file-system step (None: let it finish)."""
    child = subprocess.Popen(
        [sys.executable, "-c", PRUNER, str(root), str(RESUMED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=ENV,
        text=True,
    )
    steps, lines = [], PipeLines(child.stdout)
    while True:
        try:
            line = lines.next(wait_s(60))
        except EOFError:
            break
        assert line is not None, "the pruner said nothing for a minute"
        if line.startswith("deleted"):
            break
        steps.append(line.split()[0])
        if len(steps) == step:
            os.kill(child.pid, signal.SIGKILL)
            break
        child.stdin.write("\n")
        child.stdin.flush()
    child.wait(timeout=30)
    child.stdin.close()
    child.stdout.close()
    if step is not None and len(steps) == step:
        assert child.returncode == -signal.SIGKILL
    else:
        assert child.returncode == 0
    return steps


def test_kill_at_every_step_of_pruning_never_loses_best_last_or_resumed(base: Path, tmp_path: Path) -> None:
    """SIGKILL before each step of a prune: best, last and the resumed-from checkpoint survive and verify, every
    listed epoch verifies (a half-deleted one is never visible), restart() resumes last, and the next writer
    removes the leftovers."""
    full = tmp_path / "full"
    shutil.copytree(base, full, symlinks=True)
    steps = kill_pruner_at(full, None)
    assert CheckpointStore(full).epochs() == [BEST, RESUMED, LAST]
    assert len(steps) >= 30, steps
    model = build_model(1)
    half_deleted_seen = 0
    for k in range(1, len(steps) + 1):
        root = tmp_path / f"kill{k}"
        shutil.copytree(base, root, symlinks=True)
        kill_pruner_at(root, k)
        store = CheckpointStore(root)
        listed = store.epochs()
        assert {BEST, RESUMED, LAST} <= set(listed), f"kill before step {k} ({steps[k - 1]}): {listed}"
        for epoch in listed:
            store.verify(epoch)
        assert read_link(store.layout.link("last")) == f"epochs/{LAST:03d}"
        assert read_link(store.layout.link("best")) == f"epochs/{BEST:03d}"
        trash = [n for n in os.listdir(store.layout.ckpts) if n.startswith("trash-")]
        half_deleted_seen += any(os.listdir(os.path.join(store.layout.ckpts, t)) for t in trash)
        got = restart({"ckpt_directory": str(root)}, model, logger=None, verbose=False)
        assert got["epoch"] == LAST
        store.open_for_write()  # the kernel dropped the killed writer's lock
        assert [n for n in os.listdir(store.layout.ckpts) if store.layout.is_debris(n)] == []
        store.close()
    _figure("prune_kill_points", len(steps))
    _figure("prune_half_deleted_dirs_seen", half_deleted_seen)
    assert half_deleted_seen >= 5


HOLDER = textwrap.dedent(
    """
    import sys, time
    from candle_ckpt.storage.store import CheckpointStore
    store = CheckpointStore(sys.argv[1])  # the lock lives as long as this store object
    store.open_for_write()
    print("locked", flush=True)
    time.sleep(120)
    """
)

SECOND = textwrap.dedent(
    """
    import sys
    from candle_ckpt.storage.store import CheckpointStore
    from candle_ckpt.core.errors import DirectoryLocked
    try:
        CheckpointStore(sys.argv[1]).open_for_write()
    except DirectoryLocked as err:
        print("refused:", err)
        sys.exit(3)
    print("acquired")
    """
)


def test_second_writer_is_refused_and_a_killed_writers_lock_is_not_stale(tmp_path: Path) -> None:
    """While a process writes to a directory, another process (and this one) is refused with DirectoryLocked
    naming the holder; after the holder is killed with SIGKILL, a new writer gets the directory."""
    root = tmp_path / "job"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, env=ENV, text=True)
    try:
        assert PipeLines(holder.stdout).next(wait_s(60)) == "locked"
        second = subprocess.run([sys.executable, "-c", SECOND, str(root)], capture_output=True, env=ENV, text=True)
        assert second.returncode == 3, second.stdout + second.stderr
        assert f"in use by another writer (pid {holder.pid} on" in second.stdout
        params = {"ckpt_directory": str(root), "epochs": 2}
        with pytest.raises(DirectoryLocked, match=rf"is in use by another writer \(pid {holder.pid} "):
            CandleCheckpointCallback(params, logger=None, verbose=False)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()
    assert f"pid {holder.pid}" in (root / "ckpts" / "lock").read_text()  # the stale lock file is still there
    third = subprocess.run([sys.executable, "-c", SECOND, str(root)], capture_output=True, env=ENV, text=True)
    assert (third.returncode, third.stdout.strip()) == (0, "acquired"), third.stderr
    params = {"ckpt_directory": str(root), "epochs": 1, "ckpt_save_best_metric": "loss"}
    cb = CandleCheckpointCallback(params, logger=None, verbose=False)
    build_model(1).fit(X, Y, epochs=1, batch_size=8, verbose=0, callbacks=[cb])
    assert cb.engine.store.epochs() == [1]
    cb.engine.store.close()


def _figure(key: str, value) -> None:
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / "processes.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"\n{key}: {value}")
