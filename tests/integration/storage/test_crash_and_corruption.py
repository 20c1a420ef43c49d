"""Crash safety and corruption: what a killed job, a failed save or a damaged file leaves behind.

Every test trains a real model with ``model.fit`` and inspects what a user
would: the files on disk, the epoch ``restart()`` resumes from, the restored
weights (bit for bit) and the errors and ``ckpt.log`` lines.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from locations import REPO, job_script

import candle_ckpt as candle
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.faultfs import FaultFS  # noqa: E402

N = 3  # epochs in the prepared directories


# -- helpers -------------------------------------------------------------------------------------------------------


def fit(model, data, params: dict, *, initial_epoch: int = 0, fs: LocalFS | None = None):
    """Train to ``params["epochs"]`` with a checkpoint callback (console logging off).

    ``data`` is ``(x, y)`` or a batched ``tf.data.Dataset`` (the loops over many faults pass one
    dataset, which spares Keras converting the arrays again on every call).
    """
    x, y = data if isinstance(data, tuple) else (data, None)
    cb = candle.CandleCheckpointCallback(params, logger=None, fs=fs)
    model.fit(
        x,
        y,
        batch_size=16 if y is not None else None,
        epochs=params["epochs"],
        initial_epoch=initial_epoch,
        shuffle=False,
        verbose=0,
        callbacks=[cb],
    )
    return cb


def end_run(directory: str | os.PathLike[str]) -> None:
    """Forget this process's writer lock and restart() state, as if the job's process had exited."""


def batched(data: tuple[np.ndarray, np.ndarray]):
    """``data`` as a tf.data.Dataset of batches of 16, in order."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(data).batch(16)


def state_bytes(model) -> list[bytes]:
    """The raw bytes of every model and optimizer variable, in order."""
    return [np.asarray(v.numpy()).tobytes() for v in [*model.weights, *model.optimizer.variables]]


def stock_state(weights_file: str | os.PathLike[str], make_model: Callable) -> list[bytes]:
    """Load ``weights_file`` with stock ``model.load_weights`` (optimizer built first) and return its bytes.

    ``make_model`` is a model factory, or a model to reuse (loading overwrites every variable).
    """
    model = make_model if hasattr(make_model, "load_weights") else make_model()
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.load_weights(os.fspath(weights_file))
    return state_bytes(model)


def epoch_file(directory: str | os.PathLike[str], epoch: int, name: str = "model.keras") -> Path:
    """A checkpoint's file; by default its state file (``model.keras`` at the defaults, which stock
    ``model.load_weights`` also reads)."""
    return Path(directory) / "ckpts" / "epochs" / f"{epoch:03d}" / name


def debris(directory: str | os.PathLike[str]) -> list[str]:
    """Leftovers of an interrupted save in ``ckpts/`` (work/, trash-*, .tmp-*)."""
    ckpts = Path(directory) / "ckpts"
    return sorted(n for n in os.listdir(ckpts) if n == "work" or n.startswith(("trash-", ".tmp-")))


def assert_every_epoch_verifies(directory: str | os.PathLike[str]) -> list[int]:
    """Every ``epochs/NNN`` passes size + CRC checks (no partial checkpoint is ever visible)."""
    st = CheckpointStore(directory)
    for epoch in st.epochs():
        side, _ = st.verify(epoch)  # raises CorruptCheckpoint naming the file
        assert side.epoch == epoch
    return st.epochs()


def tree_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A pristine ``save`` directory with epochs 1..N, checkpointed every epoch (copy it before changing it)."""
    from testkit import build_model, make_data, make_params

    root = tmp_path_factory.mktemp("trained")
    params = make_params(root, epochs=N)
    fit(build_model(), make_data(), params)
    end_run(params["ckpt_directory"])
    return Path(params["ckpt_directory"])


# -- 1. fallback on corruption -------------------------------------------------------------------------------------


def _flip_byte(d: Path) -> None:
    path = epoch_file(d, 3)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def _truncate(d: Path) -> None:
    path = epoch_file(d, 3)
    os.truncate(path, path.stat().st_size // 2)


def _delete_weights(d: Path) -> None:
    epoch_file(d, 3).unlink()


def _break_sidecar(d: Path) -> None:
    epoch_file(d, 3, "ckpt-info.json").write_bytes(b'{"epoch": 3, "files": {')


def _delete_sidecar(d: Path) -> None:
    epoch_file(d, 3, "ckpt-info.json").unlink()


def _dangle_last(d: Path) -> None:
    shutil.rmtree(d / "ckpts" / "epochs" / "003")


def _retarget_last(d: Path) -> None:
    tmp = d / "ckpts" / ".retarget"
    os.symlink("epochs/099", tmp)
    os.replace(tmp, d / "ckpts" / "last")


CORRUPTIONS = {
    # name: (damage, epoch restart must fall back to, what ckpt.log must say)
    "flip-byte": (_flip_byte, 2, r"skipping epoch 3: .*003/model\.keras: CRC32 is [0-9a-f]{8} but"),
    "truncate": (_truncate, 2, r"skipping epoch 3: .*003/model\.keras: size is \d+ bytes but"),
    "delete-weights": (_delete_weights, 2, r"skipping epoch 3: .*003/model\.keras: file is missing"),
    "invalid-json-sidecar": (_break_sidecar, 2, r"skipping epoch 3: .*003/ckpt-info\.json: not valid JSON"),
    "delete-sidecar": (_delete_sidecar, 2, r"skipping epoch 3: .*003/ckpt-info\.json: sidecar is missing"),
    "dangling-last": (_dangle_last, 2, r"skipping epoch 3: 'last' points to a checkpoint that does not exist"),
    "last-to-missing-epoch": (_retarget_last, 3, r"skipping epoch 99: 'last' points to a checkpoint that does not"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_restart_falls_back_to_previous_good_epoch(case, trained, tmp_path, make_model, params):
    """A damaged ``last`` is skipped with a logged reason and the previous good epoch is restored bit for bit."""

    damage, expected, log_line = CORRUPTIONS[case]
    d = copy_dir(trained, tmp_path / "save")
    damage(d)
    model = make_model(seed=7)  # different initial weights: restart must overwrite all of them
    J = candle.restart(params(tmp_path), model, logger=None)

    assert J is not None and J["epoch"] == expected
    want = stock_state(epoch_file(trained, expected), make_model)
    assert state_bytes(model) == want
    # The comparison can tell epochs apart:
    assert want != stock_state(epoch_file(trained, 3), make_model) or expected == 3
    log = (d / "ckpt.log").read_text()
    assert re.search(log_line, log), log
    assert f"restart: resumed from {d / 'ckpts' / 'epochs' / f'{expected:03d}'}" in log


def test_every_checkpoint_corrupt_required_raises_and_auto_starts_fresh(trained, tmp_path, make_model, params):
    """With every checkpoint damaged, ``required`` raises NoValidCheckpoint naming each problem; auto returns None."""
    d = copy_dir(trained, tmp_path / "save")
    for epoch in range(1, N + 1):
        path = epoch_file(d, epoch)
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 3] ^= 0xFF
        path.write_bytes(bytes(raw))
    model = make_model(seed=7)
    before = state_bytes(model)

    with pytest.raises(candle.NoValidCheckpoint, match=r"ckpt_restart_mode=required: no valid checkpoint") as info:
        candle.restart(params(tmp_path, ckpt_restart_mode="required"), model, logger=None)
    for epoch in range(1, N + 1):
        assert f"epoch {epoch}: {epoch_file(d, epoch)}: CRC32 is" in str(info.value)

    assert candle.restart(params(tmp_path, ckpt_restart_mode="auto"), model, logger=None) is None
    assert state_bytes(model) == before  # nothing was loaded
    assert "no valid checkpoint" in (d / "ckpt.log").read_text()


# -- 2. a fault at every step of the commit protocol ---------------------------------------------------------------


@pytest.fixture(scope="module")
def save_ops(trained, tmp_path_factory) -> list[tuple[str, str]]:
    """The file-system operations of one save of epoch N+1 on top of ``trained`` (recorded, no fault)."""
    from testkit import build_model, make_data, make_params

    root = tmp_path_factory.mktemp("record")
    d = copy_dir(trained, root / "save")
    params = make_params(root, epochs=N + 1)
    model = build_model()
    assert candle.restart(params, model, logger=None)["epoch"] == N
    rec = FaultFS()
    fit(model, make_data(), params, initial_epoch=N, fs=rec)
    end_run(d)
    assert CheckpointStore(d).link_epoch("last") == N + 1
    return rec.ops


def _op_index(ops: list[tuple[str, str]], op: str, tail: str) -> int:
    hits = [i for i, (o, p) in enumerate(ops) if o == op and p.endswith(tail)]
    assert len(hits) == 1, (op, tail, hits)
    return hits[0]


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_fault_at_every_commit_step_keeps_earlier_checkpoints(
    on_error, trained, save_ops, tmp_path, make_model, data, params
):
    """An EIO at any single file-system operation of a save leaves no partial checkpoint and loses nothing."""
    ops = save_ops
    kinds = {op for op, _ in ops}
    assert {"mkdir", "create", "write", "fsync", "fsync_dir", "rename", "symlink", "replace"} <= kinds
    # A save that fails at any step is withdrawn as a whole: epochs/N+1 is renamed away again if it
    # was already published, and `last`/`best` are put back, so what a failed save leaves is exactly
    # what was there before it (the store's commit contract; fsyncgate: no half-durable success).
    _op_index(ops, "rename", f"epochs/{N + 1:03d}")  # the publishing rename is among the faulted steps
    _op_index(ops, "replace", "ckpts/last")  # and so is the move of `last`
    pristine = {e: tree_bytes(epoch_file(trained, e).parent) for e in range(1, N + 1)}
    model, probe, stock = make_model(), make_model(seed=3), make_model(seed=4)
    data = batched(data)
    weights_checked: set[int] = set()

    for k, (op, path) in enumerate(ops):
        where = f"fault at op {k} ({op} {path})"
        d = copy_dir(trained, tmp_path / f"k{k:03d}" / "save")
        run_params = params(d.parent, epochs=N + 1 if on_error == "raise" else N + 2, ckpt_on_error=on_error)
        # The model just keeps training (no restart() per fault, to keep the loop fast): the file
        # operations of a save do not depend on the weights, which the check on faulty.ops confirms.
        faulty = FaultFS(fail_at=k + 1)
        if on_error == "raise":
            with pytest.raises(candle.CheckpointSaveError, match=rf"^epoch {N + 1}: .*injected EIO at step {k} in "):
                fit(model, data, run_params, initial_epoch=N, fs=faulty)
        else:
            fit(model, data, run_params, initial_epoch=N, fs=faulty)  # training goes on
            assert f"WARNING epoch {N + 1}: checkpoint save failed: OSError" in (d / "ckpt.log").read_text(), where
        assert faulty.ops[k][0] == op and os.path.basename(faulty.ops[k][1])[:9] == os.path.basename(path)[:9], where
        end_run(d)

        expect_epochs = list(range(1, N + 1)) + [N + 2] * (on_error == "warn")
        assert debris(d) == [], where
        assert assert_every_epoch_verifies(d) == expect_epochs, where
        for e in range(1, N + 1):
            assert tree_bytes(epoch_file(d, e).parent) == pristine[e], where
        if on_error == "raise":
            expect_resume = N
        else:
            expect_resume = N + 2  # the next epoch saved fine
        J = candle.restart(params(d.parent), probe, logger=None)
        assert J["epoch"] == expect_resume, where
        if expect_resume not in weights_checked:  # bit-for-bit once per outcome (restart() is tested above)
            assert state_bytes(probe) == stock_state(epoch_file(d, expect_resume), stock), where
            weights_checked.add(expect_resume)
        shutil.rmtree(d.parent)


def test_writer_that_swallows_a_failed_write_cannot_commit(tmp_path):
    """If a file writer catches the EIO of one of its writes, the save still fails and nothing is committed."""
    from candle_ckpt.core.sidecar import Sidecar
    from candle_ckpt.storage.store import FileSpec

    def careless(f) -> None:
        f.write(b"a" * 100)
        try:
            f.write(b"b" * 100)
        except OSError:
            pass  # what a careless (or C-level) writer might do
        f.write(b"c" * 100)

    st = CheckpointStore(tmp_path / "save", fs=FaultFS(fail_at=2, kinds=("write",)))
    st.open_for_write()
    template = Sidecar(epoch=1, generation=0, model_file="model.weights.h5", files={})
    with pytest.raises(OSError, match=r"injected EIO at step \d+ in write"):
        st.commit(1, [FileSpec("model.weights.h5", careless)], template)
    assert st.epochs() == [] and debris(tmp_path / "save") == []


# -- 3. kill -9 at many moments ------------------------------------------------------------------------------------


def _load_crash_job():
    spec = importlib.util.spec_from_file_location("crash_job", job_script("crash_job.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class JobServer:
    """``crash_job.py --serve`` in a subprocess: forks one training job per ``run()``; every wait is bounded."""

    def __init__(self, directory: Path, stderr_path: Path, width: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
        self.stderr_path = stderr_path
        self.proc = subprocess.Popen(
            [sys.executable, str(job_script("crash_job.py")), str(directory), "--serve", "--width", str(width)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr_path.open("wb"),
            text=True,
            bufsize=1,
            env=env,
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.strip()))
        self.lines.put((time.monotonic(), "<eof>"))

    def expect(self, prefix: str, timeout: float, seen: list[tuple[float, str]] | None = None) -> tuple[float, str]:
        """Wait for the next line starting with ``prefix``, keeping every line read in ``seen``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                stamp, line = self.lines.get(timeout=max(left, 0.001))
            except queue.Empty:
                pytest.fail(f"no {prefix!r} line from crash_job.py within {timeout} s; stderr:\n{self.stderr()}")
            if seen is not None:
                seen.append((stamp, line))
            if line.startswith(prefix):
                return stamp, line
            if line == "<eof>":
                pytest.fail(f"crash_job.py exited while waiting for {prefix!r}; stderr:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def run(self) -> int:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return int(self.expect("child ", 30)[1].split()[1])

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.mark.slow
def test_kill_9_at_many_moments_resumes_from_a_committed_epoch(tmp_path, params):
    """SIGKILL of a training job at 14 moments (some mid-save) never leaves restart() a partial or older checkpoint.

    Where none of the 14 landed inside a save (on a busy machine the parent may read "begin" after a short save
    has ended), up to 8 more kills early in a save are made, until one does."""
    job = _load_crash_job()
    width = 512  # ~2 MB of weights + Adam state per file, so a save takes tens of milliseconds
    d = tmp_path / "save"
    job_params = job.job_params(str(d), epochs=100_000)
    probe, stock = job.build_model(width), job.build_model(width)
    stock.optimizer.build(stock.trainable_variables)
    rng = random.Random(20240607)
    kills, extra = 14, 8
    server = JobServer(d, tmp_path / "crash_job.stderr", width)
    outcomes: list[str] = []
    reported = 0  # highest epoch any child printed as committed
    save_s = 0.1  # estimate of one save, refined from the children's begin -> committed lines
    resumed = None
    try:
        server.expect("serving", 120)
        i = 0
        while i < kills or ("mid-save" not in outcomes and i < kills + extra):
            pid = server.run()
            seen: list[tuple[float, str]] = []
            _, ready = server.expect("ready ", 60, seen)
            assert int(ready.split()[1]) == (resumed or 0), "the child resumed where the parent's restart() did"
            if i == 0:
                delay = 0.0  # before the first epoch ends: nothing can be committed
            else:
                # Let this run commit one epoch, then kill after the next epoch's save began,
                # spreading the delays over [0, 1.6 x save): early ones land inside the save
                # (snapshot, writes, fsyncs, rename, links, prune), later ones after it.
                server.expect("committed ", 60, seen)
                server.expect("begin ", 60, seen)
                spread = (i - 1) / (kills - 2) if i < kills else rng.uniform(0.0, 0.3)  # an extra one: early
                delay = save_s * 1.6 * spread * rng.uniform(0.8, 1.2)
                time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            _, reaped = server.expect(f"reaped {pid} ", 30, seen)
            status = int(reaped.split()[2])
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, server.stderr()

            begins = {int(line.split()[1]): t for t, line in seen if line.startswith("begin ")}
            for t, line in seen:
                if line.startswith("committed "):
                    epoch = int(line.split()[1])
                    reported = max(reported, epoch)
                    save_s = 0.5 * save_s + 0.5 * (t - begins[epoch])
            left = debris(d) if (d / "ckpts").is_dir() else []

            J = candle.restart(job_params, probe, logger=None)  # auto, as a fresh run would
            if J is None:
                assert reported == 0, f"kill {i}: restart() started from scratch although epoch {reported} committed"
                assert not (d / "ckpts" / "epochs").is_dir() or CheckpointStore(d).find_valid() is None
            else:
                assert J["epoch"] >= reported, f"kill {i}: resumed {J['epoch']} < reported committed {reported}"
                side, _ = CheckpointStore(d).verify(J["epoch"])  # every CRC of the resumed checkpoint
                assert side.to_dict() == J
                stock.load_weights(epoch_file(d, J["epoch"]))  # stock Keras reading the same file
                assert state_bytes(probe) == state_bytes(stock)
            outcomes.append("mid-save" if left else "before-first-commit" if J is None else "between-saves")
            assert_every_epoch_verifies(d) if (d / "ckpts").is_dir() else None
            resumed = J["epoch"] if J else None
            # The next writer takes over the killed one's lock and cleans its leftovers.
            if (d / "ckpts").is_dir():
                candle.CandleCheckpointCallback(job_params, logger=None)
                assert debris(d) == [], f"kill {i}: leftovers {left} not cleaned"
            end_run(d)
            i += 1
    finally:
        server.close()

    print(f"kill -9 outcomes: {outcomes}; save ~{save_s * 1000:.0f} ms")
    assert kills <= len(outcomes) <= kills + extra
    assert outcomes[0] == "before-first-commit"
    assert "mid-save" in outcomes, f"no kill landed inside a save: {outcomes}"
    assert reported >= 2 and resumed >= reported


# -- 4. leftover debris --------------------------------------------------------------------------------------------


def test_debris_is_never_restored_and_is_removed_by_the_next_writer(trained, tmp_path, make_model, params):
    """``work/``, ``trash-*``, ``.tmp-*`` left by a crash are ignored by restart() and removed by the next callback."""
    d = copy_dir(trained, tmp_path / "save")
    ckpts = d / "ckpts"
    # work/ holding a complete-looking later checkpoint, a trash dir and a temp link to it.
    shutil.copytree(ckpts / "epochs" / "003", ckpts / "work")
    (ckpts / "work" / "junk.bin").write_bytes(os.urandom(64))
    shutil.copytree(ckpts / "epochs" / "001", ckpts / "trash-001-abc")
    os.symlink("work", ckpts / ".tmp-last-xyz")
    model = make_model(seed=5)

    J = candle.restart(params(tmp_path), model, logger=None)
    assert J["epoch"] == N
    assert state_bytes(model) == stock_state(epoch_file(trained, N), make_model)
    assert debris(d) == [".tmp-last-xyz", "trash-001-abc", "work"]  # a reader removes nothing

    candle.CandleCheckpointCallback(params(tmp_path), logger=None)
    assert debris(d) == []
    assert assert_every_epoch_verifies(d) == [1, 2, 3]
    assert os.readlink(ckpts / "last") == "epochs/003"


# -- 5. copied and moved directories -------------------------------------------------------------------------------


def test_copied_and_moved_directories_restart_from_their_own_copy(trained, tmp_path, make_model, data, params):
    """A checkpoint directory copied (then the original deleted) or moved restarts and continues from its own files."""
    original = copy_dir(trained, tmp_path / "orig" / "save")
    assert os.readlink(original / "ckpts" / "last") == "epochs/003"
    assert os.readlink(original / "ckpts" / "best") == "epochs/003"
    want = stock_state(epoch_file(trained, N), make_model)

    copied = copy_dir(original, tmp_path / "copied" / "save")
    shutil.rmtree(original.parent)  # nothing under the original can be read any more
    model = make_model(seed=9)
    J = candle.restart(params(copied.parent), model, logger=None)
    assert J["epoch"] == N and J == CheckpointStore(copied).read_sidecar(N).to_dict()
    assert state_bytes(model) == want

    moved = tmp_path / "moved" / "save"
    moved.parent.mkdir()
    os.rename(copied, moved)
    model = make_model(seed=11)
    run_params = params(moved.parent, epochs=N + 1)
    J = candle.restart(run_params, model, logger=None)
    assert J["epoch"] == N and state_bytes(model) == want
    fit(model, data, run_params, initial_epoch=N)
    assert os.readlink(moved / "ckpts" / "last") == "epochs/004"
    assert assert_every_epoch_verifies(moved) == [1, 2, 3, 4]
    assert not original.parent.exists() and not copied.exists()


# -- 6. replacing an epoch of a rolled-back lineage ----------------------------------------------------------------


@pytest.fixture(scope="module")
def six_epochs(tmp_path_factory) -> Path:
    """A ``save`` directory trained to epoch 6 (every epoch kept)."""
    from testkit import build_model, make_data, make_params

    root = tmp_path_factory.mktemp("six")
    params = make_params(root, epochs=6)
    fit(build_model(), make_data(), params)
    end_run(params["ckpt_directory"])
    return Path(params["ckpt_directory"])


def test_rollback_lineage_replaces_epochs_only_when_the_new_ones_are_complete(six_epochs, tmp_path, make_model, params):
    """After a rollback to epoch 3, epochs 4 and 5 are replaced by the new lineage; 6 of the old one stays."""
    from testkit import make_data

    d = copy_dir(six_epochs, tmp_path / "save")
    old = {e: tree_bytes(epoch_file(d, e).parent) for e in (4, 5, 6)}
    # Different data make a different lineage (a different learning rate would not: restart()
    # restores the optimizer's learning_rate variable with the rest of its state).
    model = make_model(seed=2)
    J = candle.restart(params(tmp_path, ckpt_restart_epoch=3), model, logger=None)
    assert J["epoch"] == 3
    fit(model, make_data(seed=1), params(tmp_path, epochs=5), initial_epoch=3)

    assert assert_every_epoch_verifies(d) == [1, 2, 3, 4, 5, 6]
    for e in (4, 5):
        assert stock_state(epoch_file(d, e), make_model) != stock_state(epoch_file(six_epochs, e), make_model)
        assert CheckpointStore(d).read_sidecar(e).resumed_from == 3
    assert tree_bytes(epoch_file(d, 6).parent) == old[6]
    assert os.readlink(d / "ckpts" / "last") == "epochs/005"
    assert debris(d) == []
    probe = make_model(seed=4)
    assert candle.restart(params(tmp_path), probe, logger=None)["epoch"] == 5
    assert state_bytes(probe) == stock_state(epoch_file(d, 5), make_model)


def test_fault_while_replacing_an_epoch_keeps_the_old_one(six_epochs, tmp_path, make_model, params):
    """A fault at any non-write step of replacing ``epochs/004`` leaves the old 004 and the links as they were."""
    from testkit import make_data

    # Record the replace path once, then fail each of its operations (writes are covered above).
    data = batched(make_data(seed=1))  # another lineage than the one that wrote six_epochs
    rec_dir = copy_dir(six_epochs, tmp_path / "rec" / "save")
    model = make_model()
    assert candle.restart(params(rec_dir.parent, ckpt_restart_epoch=3), model, logger=None)["epoch"] == 3
    rec = FaultFS()
    fit(model, data, params(rec_dir.parent, epochs=4), initial_epoch=3, fs=rec)
    end_run(rec_dir)
    ops = rec.ops
    aside = next(i for i, (o, p) in enumerate(ops) if o == "rename" and "/trash-004-" in p)
    into_place = _op_index(ops, "rename", "epochs/004")
    assert ops.index(("rmtree", ops[aside][1])) > into_place, "the old 004 is removed only after the new one is in"
    _op_index(ops, "replace", "ckpts/last")
    old4 = tree_bytes(epoch_file(six_epochs, 4).parent)
    new4 = stock_state(epoch_file(rec_dir, 4), make_model)  # the new lineage's weights (timestamps differ per run)
    assert stock_state(epoch_file(six_epochs, 4), make_model) != new4
    points = [k for k, (o, _) in enumerate(ops) if o != "write"]
    assert aside in points and into_place in points

    for k in points:
        where = f"fault at op {k} ({ops[k][0]} {ops[k][1]})"
        d = copy_dir(six_epochs, tmp_path / f"k{k:03d}" / "save")
        assert candle.restart(params(d.parent, ckpt_restart_epoch=3), model, logger=None)["epoch"] == 3
        cleanup_only = k == ops.index(("rmtree", ops[aside][1]))  # the commit is already durable then
        if cleanup_only:
            fit(model, data, params(d.parent, epochs=4), initial_epoch=3, fs=FaultFS(fail_at=k + 1))
        else:
            with pytest.raises(candle.CheckpointSaveError, match=rf"^epoch 4: .*injected EIO at step {k} in "):
                fit(model, data, params(d.parent, epochs=4), initial_epoch=3, fs=FaultFS(fail_at=k + 1))
        end_run(d)
        candle.CandleCheckpointCallback(params(d.parent, epochs=4), logger=None)  # the next writer cleans up
        end_run(d)
        assert debris(d) == [], where
        assert assert_every_epoch_verifies(d) == [1, 2, 3, 4, 5, 6], where
        if cleanup_only:  # failing to delete the old lineage's 004 does not undo the new one
            assert stock_state(epoch_file(d, 4), make_model) == new4, where
            assert os.readlink(d / "ckpts" / "last") == "epochs/004", where
        else:
            # A failed save is withdrawn as a whole, even after the new 004 was renamed into place:
            # the old 004 is put back and `last` still points where it did.
            assert tree_bytes(epoch_file(d, 4).parent) == old4, where
            assert os.readlink(d / "ckpts" / "last") == "epochs/006", where
        shutil.rmtree(d.parent)


# -- 7. pruning across runs ----------------------------------------------------------------------------------------


def test_pruning_covers_checkpoints_of_earlier_runs(tmp_path, make_model, data, params):
    """keep_limit=2 over three runs keeps only the newest 2, best, last and resumed-from epochs, whoever wrote them."""
    # save_best_mode=max on a falling loss: epoch 1 stays "best" forever, so best, last and the
    # resumed-from checkpoint are three different epochs.
    run_params = params(tmp_path, ckpt_keep_limit=2, ckpt_save_best_mode="max")
    d = Path(run_params["ckpt_directory"])
    expected = {3: [1, 2, 3], 6: [1, 3, 5, 6], 9: [1, 6, 8, 9]}
    start = 0
    for end in (3, 6, 9):
        model = make_model()
        J = candle.restart(run_params, model, logger=None)
        assert (J["epoch"] if J else 0) == start
        fit(model, data, {**run_params, "epochs": end}, initial_epoch=start)
        end_run(d)
        assert assert_every_epoch_verifies(d) == expected[end], f"after the run to epoch {end}"
        assert os.readlink(d / "ckpts" / "best") == "epochs/001"
        assert os.readlink(d / "ckpts" / "last") == f"epochs/{end:03d}"
        start = end
    log = (d / "ckpt.log").read_text()
    assert "pruned epochs 003, 005" in log  # written by runs 1 and 2, pruned by run 3
