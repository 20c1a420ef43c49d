"""Asynchronous checkpoints (``ckpt_async``): behaviour, never timing.

In-process tests drive a real ``model.fit`` and steer the writer thread with a
:class:`LocalFS` hook (fail, or block on an Event). Crash and signal tests run
``_async_child.py`` in real subprocesses.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
from doclines import assert_log_example
from locations import REPO, job_script
from pace import wait_s
from testkit import build_model  # noqa: E402

from candle_ckpt import CandleCheckpointCallback, CheckpointSaveError
from candle_ckpt.core import layout as L
from candle_ckpt.core.fs import LocalFS, read_link
from candle_ckpt.keras import callback as callback_mod
from candle_ckpt.keras.adapter import capture_model
from candle_ckpt.keras.state import ModelState
from candle_ckpt.storage.store import CheckpointStore

CHILD = job_script("_async_child.py")
WAIT = wait_s(40)  # seconds: a bound on a test that hangs, scaled to the machine (pace), never a measurement


X = np.random.RandomState(0).rand(32, 8).astype("float32")
Y = (X.sum(axis=1, keepdims=True) * 0.3).astype("float32")


def params(directory, epochs: int = 3, **extra) -> dict:
    return {
        "ckpt_directory": str(directory),
        "epochs": epochs,
        "ckpt_async": True,
        "ckpt_save_interval": 1,
        "ckpt_save_best_metric": "loss",
        "ckpt_save_weights_only": True,
        "ckpt_keep_limit": 100,
        **extra,
    }


def fit(model: keras.Model, cb, epochs: int, *more) -> None:
    model.fit(X, Y, epochs=epochs, batch_size=8, shuffle=False, verbose=0, callbacks=[*more, cb])


def last_epoch(directory) -> int | None:
    target = read_link(L.Layout.at(str(directory)).link("last"))
    return None if target is None else L.parse_link_target(target)


class ScriptedFS(LocalFS):
    """Records every operation of the store; runs ``actions[(op, n)]`` at ``op`` on
    the weights file of the n-th commit (counted by its ``create``)."""

    def __init__(self, actions=None) -> None:
        self.actions = actions or {}
        self.log: list[tuple[str, str, str]] = []
        self.commits = 0
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def hook(self, op: str, path: str) -> None:
        weights = path.endswith(os.path.join("work", L.WEIGHTS_FILE))
        with self._lock:
            if op == "create" and weights:
                self.commits += 1
                self.active += 1
                self.max_active = max(self.max_active, self.active)
            if op == "replace" and os.path.basename(path) == "last":
                self.active -= 1
            self.log.append((op, path, threading.current_thread().name))
            n = self.commits
        action = self.actions.get((op, n)) if weights else None
        if action is not None:
            action()


def fail(_: str = "") -> None:
    raise OSError(28, "injected: no space left on device")


def block(entered: threading.Event, release: threading.Event):
    def action() -> None:
        entered.set()
        release.wait(WAIT)

    return action


class EpochRecorder(keras.callbacks.Callback):
    """Placed before the checkpoint callback: records epoch ends (and snapshots)."""

    def __init__(self, snapshot_at: int | None = None) -> None:
        super().__init__()
        self.ended: list[int] = []
        self.snapshot_at = snapshot_at
        self.snapshot = None

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.ended.append(epoch)
        if epoch == self.snapshot_at:
            self.snapshot = ModelState(self.model).snapshot()


@pytest.fixture(autouse=True)
def sigterm_untouched():
    """Every test must leave SIGTERM's handler as it found it."""
    from candle_ckpt.engine.signals import process_signals

    before = signal.getsignal(signal.SIGTERM)
    yield
    process_signals().teardown(deliver=False)  # what restart() caught for a fit that never came ends with the program
    after = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, before)
    assert after is before


def watch_wait(cb) -> threading.Event:
    """Set the returned Event once the training thread is inside its wait for a write in flight.

    It is set from the job's "done" Event's ``wait``, which the writer's wait
    calls after starting its clock: whatever the test does after the Event is
    set is inside the recorded wait.
    """
    waiting = threading.Event()
    writer = cb.engine.writer
    real_submit = writer.submit

    def submit(job, label="a checkpoint write") -> None:
        real_submit(job, label)
        done = writer._done
        real_wait = done.wait

        def wait(timeout=None) -> bool:
            waiting.set()
            return real_wait(timeout)

        done.wait = wait

    writer.submit = submit
    return waiting


# -- errors of the writer thread ------------------------------------------------------
def test_writer_error_is_raised_on_the_training_thread_at_the_next_save(tmp_path):
    """With ckpt_on_error=raise, a failed background write stops fit at the next epoch end."""
    fs = ScriptedFS({("create", 1): fail})
    cb = CandleCheckpointCallback(params(tmp_path), verbose=False, fs=fs)
    recorder = EpochRecorder()
    with pytest.raises(CheckpointSaveError, match=r"epoch 1: checkpoint save failed: OSError: .*injected"):
        fit(build_model(7), cb, 3, recorder)
    assert recorder.ended == [0, 1]  # raised at the end of the second epoch, not later
    failing = [thread for op, path, thread in fs.log if op == "create" and path.endswith(L.WEIGHTS_FILE)]
    assert failing == ["candle_ckpt-writer"]  # the failure happened on the writer thread
    assert CheckpointStore(tmp_path).epochs() == []
    assert last_epoch(tmp_path) is None
    assert not os.path.exists(L.Layout.at(str(tmp_path)).work)


def test_writer_error_of_the_last_epoch_is_raised_at_train_end(tmp_path):
    """A failed write of the last epoch raises from fit (on_train_end); the earlier ones stay."""
    fs = ScriptedFS({("create", 3): fail})
    cb = CandleCheckpointCallback(params(tmp_path), verbose=False, fs=fs)
    recorder = EpochRecorder()
    with pytest.raises(CheckpointSaveError, match=r"epoch 3: checkpoint save failed: OSError: .*injected"):
        fit(build_model(7), cb, 3, recorder)
    assert recorder.ended == [0, 1, 2]
    assert CheckpointStore(tmp_path).epochs() == [1, 2]
    assert last_epoch(tmp_path) == 2


def test_writer_error_in_warn_mode_is_logged_and_training_continues(tmp_path):
    """With ckpt_on_error=warn, the failure is logged and later epochs are still committed."""
    fs = ScriptedFS({("create", 1): fail})
    cb = CandleCheckpointCallback(params(tmp_path, ckpt_on_error="warn"), verbose=False, fs=fs)
    fit(build_model(7), cb, 3)
    errors = cb.stats()["errors"]
    assert len(errors) == 1 and errors[0].startswith("epoch 1: checkpoint save failed: OSError")
    log = Path(L.Layout.at(str(tmp_path)).log).read_text()
    assert "WARNING epoch 1: checkpoint save failed: OSError" in log
    assert "ckpt_on_error=warn: training continues" in log
    assert CheckpointStore(tmp_path).epochs() == [2, 3]
    assert last_epoch(tmp_path) == 3


@pytest.mark.parametrize("async_save", [True, False])
def test_failed_best_is_not_kept_as_the_best_to_beat(tmp_path, async_save):
    """After a new best fails to save (warn), a later epoch better than the durable best becomes best."""
    fs = ScriptedFS({("create", 2): fail})
    cb = CandleCheckpointCallback(
        params(tmp_path, epochs=4, ckpt_on_error="warn", ckpt_save_interval=100, ckpt_async=async_save),
        verbose=False,
        fs=fs,
    )
    cb.engine.open()  # outside fit, the test takes the writer lock itself (fit does it in on_train_begin)
    state = ModelState(build_model(7))
    # loss 5 (best, saved), 1 (best, the save fails), 3 (beats the durable 5: saved as best), 4 (final)
    for epoch, loss in enumerate([5.0, 1.0, 3.0, 4.0], start=1):
        cb.engine.save(epoch, {"loss": loss}, lambda: capture_model(state, cb.cfg))
    cb.engine.finish()
    assert CheckpointStore(tmp_path).epochs() == [1, 3, 4]
    assert CheckpointStore(tmp_path).link_epoch("best") == 3


def test_writer_error_still_pending_at_exit_is_logged(tmp_path):
    """A write that fails when nobody will call the callback again is logged by the exit hook."""
    entered, release = threading.Event(), threading.Event()

    def block_then_fail() -> None:
        block(entered, release)()
        fail()

    fs = ScriptedFS({("create", 1): block_then_fail})
    cb = CandleCheckpointCallback(params(tmp_path, epochs=1), verbose=False, fs=fs)
    cb.engine.open()  # outside fit, the test takes the writer lock itself
    state = ModelState(build_model(7))
    cb.engine.save(1, {"loss": 1.0}, lambda: capture_model(state, cb.cfg))
    assert entered.wait(WAIT)
    release.set()
    cb.engine.writer.join_at_exit()  # what the atexit hook runs for every live writer
    log = Path(L.Layout.at(str(tmp_path)).log).read_text()
    assert "exit: waiting up to 600 s for the checkpoint write of epoch 1" in log
    assert "ERROR epoch 1: checkpoint save failed at exit: OSError" in log
    assert cb.stats()["errors"] == [
        "epoch 1: checkpoint save failed at exit: OSError: [Errno 28] injected: no space left on device"
    ]


# -- one write in flight, snapshot before the next step, join -------------------------
def test_second_save_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    """The next save waits (recorded in writer_wait_s) before its snapshot; commits never overlap."""
    entered, release = threading.Event(), threading.Event()
    fs = ScriptedFS({("fsync", 1): block(entered, release)})
    cb = CandleCheckpointCallback(params(tmp_path, epochs=2), verbose=False, fs=fs)
    captures = []
    real_capture = callback_mod.capture_model
    monkeypatch.setattr(callback_mod, "capture_model", lambda s, c: captures.append(1) or real_capture(s, c))
    waiting = watch_wait(cb)
    model = build_model(7)
    train = threading.Thread(target=fit, args=(model, cb, 2))
    train.start()
    assert entered.wait(WAIT) and waiting.wait(WAIT)
    blocked_from = time.perf_counter()
    # The training thread is parked in the second save: no second snapshot exists yet.
    assert len(captures) == 1
    assert CheckpointStore(tmp_path).epochs() == []
    assert train.is_alive()
    blocked_for = time.perf_counter() - blocked_from
    release.set()
    train.join(WAIT)
    assert not train.is_alive()
    assert len(captures) == 2
    assert CheckpointStore(tmp_path).epochs() == [1, 2] and last_epoch(tmp_path) == 2
    waits = cb.stats()["writer_wait_s"]
    assert len(waits) == 2 and waits[1] >= blocked_for  # the recorded wait covers the blocked interval
    assert fs.max_active == 1
    writers = {thread for op, path, thread in fs.log if op in ("create", "rename", "replace")}
    assert writers == {"candle_ckpt-writer"}


def test_snapshot_is_taken_before_the_next_optimizer_step(tmp_path):
    """The file written for epoch 1 holds the epoch-1 state, even though epoch 2 trained before it was written."""
    entered, release = threading.Event(), threading.Event()
    fs = ScriptedFS({("create", 1): block(entered, release)})
    cb = CandleCheckpointCallback(params(tmp_path, epochs=2), verbose=False, fs=fs)
    waiting = watch_wait(cb)
    recorder = EpochRecorder(snapshot_at=0)
    model = build_model(7)
    train = threading.Thread(target=fit, args=(model, cb, 2, recorder))
    train.start()
    assert entered.wait(WAIT) and waiting.wait(WAIT)
    after_step = ModelState(model).snapshot()  # epoch 2 has trained; epoch 1 is not written yet
    release.set()
    train.join(WAIT)
    assert not train.is_alive()
    expected = {f"{p}/vars/{k}".lstrip("/"): a for p, _, items in recorder.snapshot.entries for k, a in items}
    later = {f"{p}/vars/{k}".lstrip("/"): a for p, _, items in after_step.entries for k, a in items}
    path = os.path.join(L.Layout.at(str(tmp_path)).epoch_dir(1), L.WEIGHTS_FILE)
    with h5py.File(path, "r") as f:
        written = {name: f[name][()] for name in expected}
    assert any(not np.array_equal(expected[n], later[n]) for n in expected)  # the step did change the state
    for name, array in expected.items():
        assert written[name].dtype == array.dtype and written[name].tobytes() == array.tobytes(), name


def test_train_end_joins_the_writer(tmp_path):
    """When fit returns, the last epoch's write is committed and 'last' points to it."""
    entered, release = threading.Event(), threading.Event()
    fs = ScriptedFS({("fsync", 3): block(entered, release)})
    cb = CandleCheckpointCallback(params(tmp_path), verbose=False, fs=fs)
    # Release the last write only once fit is inside on_train_end's join.
    real_finish = cb.engine.finish

    def finish(timeout=None) -> None:
        threading.Thread(target=lambda: entered.wait(WAIT) and release.set()).start()
        real_finish(timeout)

    cb.engine.finish = finish
    fit(build_model(7), cb, 3)
    assert not cb.engine.writer.in_flight()
    assert CheckpointStore(tmp_path).epochs() == [1, 2, 3]
    assert last_epoch(tmp_path) == 3
    assert [r["epoch"] for r in cb.stats()["saves"]] == [1, 2, 3]


def test_a_writer_that_cannot_keep_up_is_reported_once(tmp_path):
    """When epoch ends find the writer busy, ckpt.log says once how long training waited and the speed needed,
    in a line of the shape docs/performance.rst shows."""
    fs = ScriptedFS({("fsync", n): lambda: time.sleep(0.6) for n in (1, 2, 3)})
    cb = CandleCheckpointCallback(params(tmp_path, 4), verbose=False, fs=fs)
    fit(build_model(7), cb, 4)
    waits = cb.stats()["writer_wait_s"]
    assert sum(w > 0.1 for w in waits) >= 2  # later epoch ends found the previous write still running
    log = Path(L.Layout.at(str(tmp_path)).log).read_text()
    slow = [line for line in log.splitlines() if "training waited" in line]
    assert len(slow) == 1, log
    size = r"([\d.]+) (B|kB|MB|GB)"  # human_bytes picks the unit
    found = re.search(
        r"WARNING epoch (\d): training waited ([\d.]+) s for the checkpoint write of epoch (\d), which was still "
        rf"running: it wrote {size} in ([\d.]+) s \([\d.]+ (?:B|kB|MB|GB)/s\), and keeping up with one save every "
        rf"([\d.]+) s of training needs {size}/s\.",
        slow[0],
    )
    assert found, slow[0]
    assert_log_example("performance.rst", slow[0])
    scale = {"B": 1e-3, "kB": 1.0, "MB": 1e3, "GB": 1e6}
    g = found.groups()
    epoch, waited, written = float(g[0]), float(g[1]), float(g[2])
    kb, took, every, needed = float(g[3]) * scale[g[4]], float(g[5]), float(g[6]), float(g[7]) * scale[g[8]]
    assert written == epoch - 1 and waited > 0 and took >= 0.6  # the write took at least the injected sleep
    assert abs(took - (every + waited)) < 0.02
    # `every` is printed to 0.01 s, so the speed it implies is only known within that rounding.
    low, high = kb / (every + 0.005), kb / max(every - 0.005, 1e-9)
    assert 0.98 * low - 0.01 <= needed <= 1.02 * high + 0.01, (needed, low, high)


def test_sigterm_handler_is_installed_during_async_fit_only(tmp_path):
    """With preemption signals off, SIGTERM raises SystemExit during an async fit only; with them on (the
    default) the preemption watcher holds it in every fit; the default action is back afterwards."""
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(signal.getsignal(signal.SIGTERM))

    off = {"ckpt_preempt_signals": "none"}
    cb = CandleCheckpointCallback(params(tmp_path, epochs=1, **off), verbose=False)
    fit(build_model(7), cb, 1, Probe())
    assert seen[0] == cb.run.signals._handle and cb.run._lease.exits
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    sync_cb = CandleCheckpointCallback(params(tmp_path / "sync", epochs=1, ckpt_async=False, **off), verbose=False)
    seen.clear()
    fit(build_model(7), sync_cb, 1, Probe())
    assert seen == [signal.SIG_DFL]
    for use_async in (True, False):
        gp = params(tmp_path / f"on{use_async}", epochs=1, ckpt_async=use_async)
        on = CandleCheckpointCallback(gp, verbose=False)
        seen.clear()
        fit(build_model(7), on, 1, Probe())
        assert seen == [on.run.signals._handle] and on.run._lease.caught == ["SIGTERM"]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_user_sigterm_handler_is_left_alone(tmp_path):
    """A SIGTERM handler the user installed is neither replaced nor removed."""

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        cb = CandleCheckpointCallback(params(tmp_path, epochs=1), verbose=False)
        fit(build_model(7), cb, 1)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- real subprocesses ------------------------------------------------------------------
def child(mode: str, root: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"child exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_kill_during_async_write_then_restart_is_bit_identical(tmp_path):
    """kill -9 while epoch 3 is being written; the restart resumes from epoch 2 and ends bit-identical, and
    CSVLogger(append=True)'s file holds each epoch's row once, as the uninterrupted run's does."""
    proc = child("kill", tmp_path)
    wait_for(lambda: (tmp_path / "blocked").exists(), proc, "the write of epoch 3")
    ckpt = tmp_path / "ckpt"
    assert (tmp_path / "blocked").read_text() == "candle_ckpt-writer"
    assert os.path.isdir(L.Layout.at(str(ckpt)).work)  # killed mid-write
    proc.kill()
    proc.wait(WAIT)
    assert CheckpointStore(ckpt).epochs() == [1, 2] and last_epoch(ckpt) == 2
    rows = (tmp_path / "train.csv").read_text().splitlines()
    # Epoch 3's row (index 2) is in, its checkpoint is not; training may have gone on to write epoch 4's.
    assert [r.split(",")[0] for r in rows][:4] == ["epoch", "0", "1", "2"], rows

    resumed = child("resume", tmp_path)
    out, _ = resumed.communicate(timeout=WAIT * 2)
    assert resumed.returncode == 0, out
    result = np.load(tmp_path / "result.npz")
    assert int(result["start_epoch"]) == 2
    names = sorted(k.removeprefix("resumed_") for k in result.files if k.startswith("resumed_"))
    assert len(names) >= 4
    for i in names:
        assert result[f"resumed_{i}"].tobytes() == result[f"reference_{i}"].tobytes(), i
    assert CheckpointStore(ckpt).epochs() == [1, 2, 3, 4, 5, 6] and last_epoch(ckpt) == 6
    assert not os.path.exists(L.Layout.at(str(ckpt)).work)
    assert (tmp_path / "train.csv").read_text() == (tmp_path / "reference.csv").read_text()


@pytest.mark.parametrize(
    ("sig", "returncodes", "why"),
    [(signal.SIGTERM, {128 + signal.SIGTERM}, " after SIGTERM"), (signal.SIGINT, {-signal.SIGINT, 1}, "")],
)
def test_signal_during_async_fit_commits_the_last_snapshot(tmp_path, sig, returncodes, why):
    """SIGTERM or Ctrl-C while a write is in flight: the process exits after committing that snapshot."""
    proc = child("signal", tmp_path)
    wait_for(lambda: (tmp_path / "blocked").exists(), proc, "the write of epoch 2")
    log = Path(L.Layout.at(str(tmp_path / "ckpt")).log)
    proc.send_signal(sig)
    wait_for(lambda: log.exists() and f"exit{why}: waiting up to" in log.read_text(), proc, "the exit join")
    (tmp_path / "go").touch()
    out, _ = proc.communicate(timeout=WAIT)
    assert proc.returncode in returncodes, out
    text = log.read_text()
    assert f"exit{why}: waiting up to 600 s for the checkpoint write of epoch 2" in text
    assert f"exit{why}: the checkpoint write of epoch 2 is committed" in text
    assert text.index("exit") < text.index("epoch 2: saved 002")
    ckpt = tmp_path / "ckpt"
    assert CheckpointStore(ckpt).epochs() == [1, 2] and last_epoch(ckpt) == 2
    assert CheckpointStore(ckpt).verify(2)[0].epoch == 2


def test_exit_join_that_runs_out_is_logged(tmp_path):
    """A write that outlasts ckpt_async_timeout is logged at train end and at exit; the process still exits."""
    proc = child("timeout", tmp_path)
    out, _ = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, out
    assert "fit returned" in out
    text = Path(L.Layout.at(str(tmp_path / "ckpt")).log).read_text()
    assert "WARNING the checkpoint write of epoch 2 is still running after 0.5 s (ckpt_async_timeout)" in text
    assert (
        "ERROR exit: gave up on the checkpoint write of epoch 2 after 0.5 s (ckpt_async_timeout); "
        "it is not committed, and restart will use the previous checkpoint"
    ) in text
    ckpt = tmp_path / "ckpt"
    assert CheckpointStore(ckpt).epochs() == [1] and last_epoch(ckpt) == 1


# -- the host snapshot ---------------------------------------------------------------------
def test_async_snapshot_reuses_the_written_buffers_and_never_a_busy_one(tmp_path):
    """A copied snapshot reuses the buffers of the previous one only after that one was written."""
    model = build_model(7)
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0)  # builds the optimizer's variables
    state = ModelState(model)
    first = state.snapshot(copy=True)
    kept = [a.copy() for a in first.arrays()]
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0)  # change every variable
    second = state.snapshot(copy=True)  # the first is not written yet: new buffers
    assert not any(np.shares_memory(a, b) for a, b in zip(first.arrays(), second.arrays(), strict=True))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first.arrays(), kept, strict=True))
    second.write_h5(str(tmp_path / "second.weights.h5"))
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0)
    third = state.snapshot(copy=True)  # the second is written: its buffers are reused
    assert all(np.shares_memory(a, b) for a, b in zip(second.arrays(), third.arrays(), strict=True))
    assert all(a.flags.owndata for a in third.arrays())  # copies, not views of the variables
    current = ModelState(model).snapshot(copy=False).arrays()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(third.arrays(), current, strict=True))


@pytest.mark.tf_only  # TF read_value(); JAX and torch: test_backends.py::test_sync_snapshot_is_a_view_...
def test_sync_snapshot_is_a_view_of_the_variables():
    """The sync path writes straight from the variables: its snapshot copies nothing."""
    model = build_model(7)
    view = ModelState(model).snapshot(copy=False)
    kernel = np.asarray(model.layers[0].kernel.value.read_value())
    assert any(np.shares_memory(a, kernel) for a in view.arrays())
    assert not any(a.flags.writeable for a in view.arrays())


def test_restart_loads_from_a_mapped_file_and_unmaps_it(tmp_path):
    """restart() verifies and loads the weights through one read-only mapping of the file."""
    from candle_ckpt import restart

    cb = CandleCheckpointCallback(params(tmp_path, epochs=1, ckpt_async=False), verbose=False)
    trained = build_model(7)
    fit(trained, cb, 1)
    store = CheckpointStore(tmp_path)
    _, contents = store.verify(1, reads=[L.WEIGHTS_FILE], mapped=True)
    import mmap

    assert isinstance(contents[L.WEIGHTS_FILE], mmap.mmap)
    contents[L.WEIGHTS_FILE].close()
    fresh = build_model(7)
    info = restart(params(tmp_path, epochs=1, ckpt_restart_mode="required"), fresh, verbose=False)
    assert info["epoch"] == 1
    for a, b in zip(ModelState(trained).snapshot().arrays(), ModelState(fresh).snapshot().arrays(), strict=True):
        assert a.tobytes() == b.tobytes()


def test_a_copy_that_does_not_fit_in_memory_is_written_synchronously_and_said_once(tmp_path, monkeypatch):
    """At the defaults (ckpt_async=auto), while the host copy would take more than half of the memory left, each
    epoch's checkpoint is committed from the variables before its epoch end returns, on the training thread, and
    ckpt.log says so once; once memory is there again the saves are copied and written in the background; a
    restart loads the last one bit for bit."""
    from candle_ckpt import restart
    from candle_ckpt.engine import writer

    room = {"bytes": 1000}  # far less than two copies of the model's state
    monkeypatch.setattr(writer, "available_memory", lambda root="/": room["bytes"])

    class AtEpochBegin(keras.callbacks.Callback):  # the checkpoint callback saves after every epoch end's hooks
        committed: list[int | None] = []

        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.committed.append(last_epoch(tmp_path))
            if epoch == 2:
                room["bytes"] = 1 << 40  # memory is there again from epoch 3's save on

    fs = ScriptedFS()
    cb = CandleCheckpointCallback(params(tmp_path, 4, ckpt_async="auto"), verbose=False, fs=fs)
    trained = build_model(7)
    trained.fit(X, Y, epochs=4, batch_size=8, shuffle=False, verbose=0, callbacks=[cb, AtEpochBegin()])
    assert AtEpochBegin.committed[:3] == [None, 1, 2]  # committed before the next epoch began
    writers = [thread for op, path, thread in fs.log if op == "create" and path.endswith(L.WEIGHTS_FILE)]
    assert writers[:2] == ["MainThread", "MainThread"]
    assert writers[2:] == ["candle_ckpt-writer", "candle_ckpt-writer"], writers
    assert cb.stats()["async"] is True and [s["epoch"] for s in cb.stats()["saves"]] == [1, 2, 3, 4]
    log = Path(L.Layout.at(str(tmp_path)).log).read_text().splitlines()
    said = [line for line in log if "would take more than half of the memory" in line]
    assert len(said) == 1, log
    assert_log_example("async.rst", said[0])
    assert re.search(
        r"WARNING epoch 1: the host copy of an asynchronous save \([\d.]+ [kMG]?B\) would take more than half of "
        r"the memory this process may still use \(1\.0 kB, within its cgroup's limit\): this save, and each "
        r"later one whose copy does not fit, is written before training goes on, as with ckpt_async=false "
        r"\(said once per run\)$",
        said[0],
    ), said[0]
    fresh = build_model(8)
    assert restart(params(tmp_path, 4), fresh, logger=None)["epoch"] == 4
    mine, theirs = trained.weights + trained.optimizer.variables, fresh.weights + fresh.optimizer.variables
    for a, b in zip(mine, theirs, strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), a.path


@pytest.mark.parametrize("async_save", ["auto", False])
def test_periodic_step_checkpoints_are_written_while_training_goes_on(tmp_path, async_save):
    """At the defaults (ckpt_async=auto) a periodic step checkpoint (ckpt_save_steps) costs training its copy, as
    an epoch's does: training goes on to its next step while the first one is still being written (held here), and
    every step checkpoint is committed by the writer thread; with ckpt_async=false each is committed on the
    training thread before its step ends. Either way the run ends with its last epoch committed."""
    entered, release = threading.Event(), threading.Event()
    held = {}

    def hold() -> None:  # the first commit's weights file: the step checkpoint after step 2 of epoch 1
        entered.set()
        held["released_by_training"] = release.wait(WAIT if async_save else 0.5)

    class NextStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None) -> None:
            # Step 3 has trained while step 2's checkpoint is still pending. The writer thread may not have reached
            # the weights file yet (on JAX a step is quicker than the writer's start): wait for it, bounded, so that
            # the release comes from training while the write is held, whichever thread was first.
            if batch == 2 and entered.wait(WAIT):
                release.set()

    fs = ScriptedFS({("create", 1): hold})
    extra = {"ckpt_async": async_save, "ckpt_save_steps": 2}
    cb = CandleCheckpointCallback(params(tmp_path, 2, **extra), verbose=False, fs=fs)
    fit(build_model(9), cb, 2, NextStep())
    assert held["released_by_training"] is (async_save == "auto")
    renames = [(path, thread) for op, path, thread in fs.log if op == "rename"]
    steps = [thread for path, thread in renames if os.sep + "steps" + os.sep in path]
    assert steps, renames
    assert set(steps) == {"candle_ckpt-writer" if async_save == "auto" else "MainThread"}, renames
    assert cb.stats()["async"] is (async_save == "auto")
    assert [(s["epoch"], s.get("step")) for s in cb.stats()["saves"]][:2] == [(0, 2), (1, None)]
    assert last_epoch(tmp_path) == 2
