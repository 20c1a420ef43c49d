"""WorkerTrainingState and the tf_keras adapter in one process (the cluster tests are in test_distributed.py)."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
from testkit import build_model, make_data  # noqa: E402

import candle_ckpt as candle  # noqa: E402
import candle_ckpt.tf_keras.adapter as ck_tfk  # noqa: E402
from candle_ckpt.adapters import WorkerTrainingState  # noqa: E402
from candle_ckpt.core.errors import CheckpointError  # noqa: E402
from candle_ckpt.core.fs import LocalFS  # noqa: E402
from candle_ckpt.keras import callback as keras3_callback  # noqa: E402
from candle_ckpt.storage import store  # noqa: E402

pytestmark = pytest.mark.tf_only  # tf.distribute multi-worker training and tf_keras models


# conftest's autouse fixture makes each test start like a new process (no lock, no restart() record).
def _forget_run() -> None:
    """The same, in the middle of a test: the next object is a new run of the job."""


def _params(tmp_path: Path, epochs: int = 4) -> dict[str, Any]:
    return {"ckpt_directory": str(tmp_path / "save"), "epochs": epochs, "ckpt_save_best_metric": "loss"}


def _tfk_model() -> tf_keras.Model:
    tf_keras.utils.set_random_seed(1)
    model = tf_keras.Sequential(
        [tf_keras.Input((8,)), tf_keras.layers.Dense(16, activation="relu"), tf_keras.layers.Dense(1)]
    )
    model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    return model


def _tfk_state(model) -> list[np.ndarray]:
    return [np.asarray(w) for w in model.get_weights()] + [v.numpy() for v in model.optimizer.variables]


def _k3_model() -> keras.Model:
    return build_model(seed=1)


def _assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        np.testing.assert_array_equal(u, v, err_msg=f"array {i}")


# -- tf_keras ------------------------------------------------------------------------
def test_tf_keras_fit_resumes_bit_identical(tmp_path: Path) -> None:
    """tf_keras: 2 epochs, restart() into a fresh model (optimizer not yet built), 2 more == 4 uninterrupted."""
    x, y = make_data()
    ref = _tfk_model()
    ref.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)

    params = _params(tmp_path)
    first = _tfk_model()
    assert candle.restart(params, first, verbose=False) is None
    cb = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    first.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    _forget_run()

    second = _tfk_model()
    found = candle.restart(params, second, verbose=False)
    assert found["epoch"] == 2
    cb = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    second.fit(x, y, batch_size=16, epochs=4, initial_epoch=found["epoch"], shuffle=False, verbose=0, callbacks=[cb])
    _assert_same(_tfk_state(second), _tfk_state(ref))
    assert [s["epoch"] for s in cb.stats()["saves"]] == [3, 4]


def test_tf_keras_checkpoint_files_are_tf_keras_formats(tmp_path: Path) -> None:
    """The weights file loads with tf_keras's own load_weights and model.h5 with load_model."""
    x, y = make_data()
    params = _params(tmp_path, epochs=1)
    model = _tfk_model()
    cb = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    ckpt = tmp_path / "save" / "ckpts" / "epochs" / "001"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "ckpt-info.json",
        "model.h5",
        "model_weights.h5",
        "optimizer.npz",
        "train.state.npz",
    ]
    other = _tfk_model()
    other.load_weights(str(ckpt / "model_weights.h5"))
    _assert_same(other.get_weights(), model.get_weights())
    loaded = tf_keras.models.load_model(str(ckpt / "model.h5"), compile=False)
    _assert_same(loaded.get_weights(), model.get_weights())
    side = json.loads((ckpt / "ckpt-info.json").read_text())
    assert side["keras_version"] == f"tf_keras {tf_keras.__version__}"


def test_tf_keras_fit_handles_sigterm_during_fit_only(tmp_path: Path) -> None:
    """SIGTERM is handled during fit only, in both modes: the preemption handler (ckpt_preempt_signals,
    default SIGTERM) takes it, and the default action is back afterwards."""
    x, y = make_data()
    seen: list[Any] = []

    class Probe(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(signal.getsignal(signal.SIGTERM))

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    cb = ck_tfk.CandleCheckpointCallback({**_params(tmp_path, epochs=1), "ckpt_async": True}, verbose=False)
    _tfk_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb, Probe()])
    assert seen[0] is not signal.SIG_DFL and callable(seen[0])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert [s["epoch"] for s in cb.stats()["saves"]] == [1]
    _forget_run()
    seen.clear()
    sync_cb = ck_tfk.CandleCheckpointCallback(_params(tmp_path / "sync", epochs=1), verbose=False)
    _tfk_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[sync_cb, Probe()])
    assert seen[0] is not signal.SIG_DFL and callable(seen[0])  # the preemption flag (ckpt_preempt_signals)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_tf_keras_fit_that_raises_in_another_callback_releases_the_lock(tmp_path: Path) -> None:
    """tf_keras's fit raising in another callback skips on_train_end; the fit guard (frames from the tf_keras
    gateway) releases the directory all the same (a new writer gets it) and gives SIGTERM its handler back."""
    x, y = make_data()

    class Boom(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom in another callback")

    params = _params(tmp_path, epochs=4)
    cb = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    model = _tfk_model()
    gc.collect()
    gc.disable()  # the guard learns that fit ended when its CallbackList dies: no cycle of ours may hold it
    try:
        with pytest.raises(RuntimeError, match="boom in another callback"):
            model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[cb, Boom()])
    finally:
        gc.enable()
    deadline = time.monotonic() + 20
    while True:  # the guard's thread wakes when the list dies; a busy machine may take a while to run it
        writer = store.CheckpointStore(params["ckpt_directory"])
        try:
            writer._lock.acquire(wait_same_process_s=0)
            break
        except CheckpointError:
            writer.close()
            assert time.monotonic() < deadline, "the lock was not released after the fit raised"
            time.sleep(0.05)
    writer.close()
    # Epoch 2's end raised in another callback: the save, taken after every callback's on_epoch_end, never ran.
    assert writer.epochs() == [1]
    while signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:  # put back on this (the main) thread
        assert time.monotonic() < deadline, "the preemption watcher kept SIGTERM after the fit raised"
        time.sleep(0.05)


def test_keras3_callback_refuses_a_tf_keras_model(tmp_path: Path) -> None:
    """Giving a tf_keras model to the Keras 3 callback says which callback to use."""
    cb = keras3_callback.CandleCheckpointCallback(_params(tmp_path), verbose=False)
    with pytest.raises(TypeError, match="candle_ckpt.tf_keras.adapter.CandleCheckpointCallback"):
        cb.set_model(_tfk_model())


def test_tf_use_legacy_keras_selects_the_tf_keras_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    """With TF_USE_LEGACY_KERAS=1 (tf.keras is tf_keras), candle_ckpt.CandleCheckpointCallback is the tf_keras one."""
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.delitem(candle.__dict__, "CandleCheckpointCallback", raising=False)
    chosen = candle.CandleCheckpointCallback
    # Do not leak the cached choice. Not through monkeypatch: its undo would put this choice back at teardown when
    # the package had cached none before (the next test file in this process then got the tf_keras callback).
    del candle.__dict__["CandleCheckpointCallback"]
    assert chosen is ck_tfk.CandleCheckpointCallback


# -- WorkerTrainingState, one worker -----------------------------------------------------
def test_worker_state_single_worker_backup_restore_and_initial_epoch(tmp_path: Path) -> None:
    """One worker: back_up commits like the callback; restore + maybe_load_initial_epoch resume from it."""
    x, y = make_data()
    params = _params(tmp_path)
    model = _k3_model()
    state = WorkerTrainingState(params, model, verbose=False)
    assert state.is_chief and state.restore() is None
    assert state.maybe_load_initial_epoch_from_ckpt(0) == 0
    for epoch in range(2):
        hist = model.fit(x, y, batch_size=16, epochs=epoch + 1, initial_epoch=epoch, shuffle=False, verbose=0)
        assert state.back_up(epoch + 1, {"loss": hist.history["loss"][-1]})
    state.finish()
    state.close()  # the job ends: its writer lock goes with it
    _forget_run()

    fresh = _k3_model()
    again = WorkerTrainingState(params, fresh, verbose=False)
    assert again.restore()["epoch"] == 2
    assert again.maybe_load_initial_epoch_from_ckpt(0) == 2
    _assert_same([v.numpy() for v in fresh.weights], [v.numpy() for v in model.weights])
    _assert_same([v.numpy() for v in fresh.optimizer.variables], [v.numpy() for v in model.optimizer.variables])
    with pytest.raises(ValueError, match="mode must be 'epoch'"):
        again.maybe_load_initial_epoch_from_ckpt(0, mode="batch")


def test_restore_pulled_from_the_remote_copy_then_back_up_continues_the_generations(tmp_path: Path) -> None:
    """A chief whose directory is empty pulls the newest remote checkpoint in restore(); its next commit
    gets a later generation than the pulled one (commit order stays a total order)."""
    x, y = make_data()
    remote = (tmp_path / "remote").as_uri()
    model = _k3_model()
    first = WorkerTrainingState({**_params(tmp_path / "a"), "ckpt_upload_url": remote}, model, verbose=False)
    for epoch in (1, 2):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        assert first.back_up(epoch, {"loss": 1.0 / epoch})
    first.finish()
    _forget_run()

    params = {**_params(tmp_path / "b"), "ckpt_upload_url": remote}
    fresh = _k3_model()
    again = WorkerTrainingState(params, fresh, verbose=False)  # opens the empty directory first
    assert again.restore()["epoch"] == 2
    _assert_same([v.numpy() for v in fresh.weights], [v.numpy() for v in model.weights])
    _assert_same([v.numpy() for v in fresh.optimizer.variables], [v.numpy() for v in model.optimizer.variables])
    assert again.back_up(3, {"loss": 0.1})
    again.finish()
    local = store.CheckpointStore(tmp_path / "b" / "save")
    assert local.epochs() == [2, 3]
    assert local.read_sidecar(3).generation > local.read_sidecar(2).generation


def test_delete_backup_removes_checkpoints_only_when_asked(tmp_path: Path) -> None:
    """delete_backup() keeps CANDLE's checkpoints; remove_checkpoints=True deletes them and the links."""
    params = _params(tmp_path)
    state = WorkerTrainingState(params, _k3_model(), verbose=False)
    state.back_up(1, {"loss": 1.0})
    ckpts = tmp_path / "save" / "ckpts"
    state.delete_backup()
    assert [p.name for p in (ckpts / "epochs").iterdir()] == ["001"]
    state.delete_backup(remove_checkpoints=True)
    assert list((ckpts / "epochs").iterdir()) == []
    assert not os.path.lexists(ckpts / "last") and not os.path.lexists(ckpts / "best")


def test_restore_only_state_cannot_back_up(tmp_path: Path) -> None:
    """A writable=False state (what restart() uses) takes no lock and refuses to save."""
    state = WorkerTrainingState(_params(tmp_path), _k3_model(), verbose=False, writable=False)
    with pytest.raises(CheckpointError, match="writable=False"):
        state.back_up(1, {"loss": 1.0})
    assert not (tmp_path / "save").exists()


# -- roles -------------------------------------------------------------------------------
def _two_workers(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))


class _NonChiefStrategy:
    """The role comes from a real TFConfigClusterResolver; back_up needs no collective."""

    def __init__(self) -> None:
        self.cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()


def test_non_chief_backup_leaves_nothing_in_the_checkpoint_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1 of 2 with synchronous saves (ckpt_async=false) snapshots and writes its scratch copy, then
    removes it: no checkpoint, no ckpt.log line."""
    _two_workers(monkeypatch, 1)
    created: list[str] = []

    class Recording(LocalFS):
        def hook(self, op: str, path: str) -> None:
            if op == "create":
                created.append(os.path.relpath(path, tmp_path))

    params = {**_params(tmp_path), "ckpt_async": False}
    state = WorkerTrainingState(params, _k3_model(), _NonChiefStrategy(), verbose=False, fs=Recording())
    assert not state.is_chief
    assert state.back_up(1, {"loss": 1.0})
    assert created == ["save/ckpts/.tmp-worker-1/model.keras"]
    leftovers = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")]
    assert leftovers in ([], ["save"], ["save", "save/ckpts"])
    assert not (tmp_path / "save" / "ckpt.log").exists()


def test_non_chief_async_backup_writes_its_scratch_copy_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the defaults (ckpt_async=auto: asynchronous with 2 workers), worker 1 of 2 returns from back_up while
    its scratch copy is still being written on the background writer (never fsynced); finish() waits for it,
    and nothing is left or committed."""
    _two_workers(monkeypatch, 1)
    seen: list[tuple[str, str, str]] = []
    entered, release = threading.Event(), threading.Event()

    class Recording(LocalFS):
        def hook(self, op: str, path: str) -> None:
            if op in ("create", "fsync"):
                seen.append((op, os.path.basename(path), threading.current_thread().name))
            if op == "create":
                entered.set()
                assert release.wait(30), "the test never released the writer"

    state = WorkerTrainingState(_params(tmp_path), _k3_model(), _NonChiefStrategy(), verbose=False, fs=Recording())
    assert state.engine.writer.is_async and state.cfg.async_save is True
    assert state.back_up(1, {"loss": 1.0})
    assert entered.wait(30)
    scratch = tmp_path / "save" / "ckpts" / ".tmp-worker-1"
    assert scratch.is_dir()  # back_up has returned and the write is still in flight
    release.set()
    state.finish()
    assert seen == [("create", "model.keras", "candle_ckpt-writer")]
    assert not scratch.exists()
    assert not (tmp_path / "save" / "ckpts" / "epochs").exists()
    assert not (tmp_path / "save" / "ckpt.log").exists()


def test_several_workers_without_a_multi_worker_strategy_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TF_CONFIG with 2 workers but no MultiWorkerMirroredStrategy raises a ValueError naming the fix."""
    _two_workers(monkeypatch, 0)
    with pytest.raises(ValueError, match="not a multi-worker strategy"):
        WorkerTrainingState(_params(tmp_path), _k3_model(), verbose=False)


def test_tf_keras_fit_says_once_why_its_resume_is_not_exact(tmp_path: Path) -> None:
    """tf_keras with fit's default shuffle=True and a Dropout layer as it comes: one warning at the first save
    names the Dropout's TF1 kernels and the remedy (the shuffle resumes exactly); with shuffle=False and no
    random layer there is none."""
    x, y = make_data()
    tf_keras.utils.set_random_seed(1)
    model = tf_keras.Sequential(
        [tf_keras.Input((8,)), tf_keras.layers.Dense(16), tf_keras.layers.Dropout(0.2), tf_keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    cb = ck_tfk.CandleCheckpointCallback(_params(tmp_path, epochs=2), verbose=False)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    expected = (
        "WARNING tf_keras model: a resumed run will not be bit-identical to an uninterrupted one: random layers "
        "(Dropout) draw from stateful TF1 random kernels, whose state cannot be saved; call "
        "tf_keras.backend.experimental.enable_tf_random_generator() before building the model: they then draw "
        "from tf.random.Generator states, which the checkpoint keeps (the weights, the optimizer state and the "
        "order of fit's shuffle resume exactly)"
    )
    log = (tmp_path / "save" / "ckpt.log").read_text()
    assert [line for line in log.splitlines() if "bit-identical" in line] == [
        line for line in log.splitlines() if line.endswith(expected)
    ]
    assert log.count(expected) == 1
    _forget_run()
    cb = ck_tfk.CandleCheckpointCallback(_params(tmp_path / "plain", epochs=2), verbose=False)
    _tfk_model().fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    assert "bit-identical" not in (tmp_path / "plain" / "save" / "ckpt.log").read_text()


@pytest.mark.parametrize("tasks", [{"worker": 3}, {"chief": 1, "worker": 2}], ids=["workers", "chief+workers"])
def test_the_chief_is_rank_0_of_the_workers_group(monkeypatch: pytest.MonkeyPatch, tasks: dict[str, int]) -> None:
    """Every task of a TF_CONFIG cluster (with a "chief" task or without): its rank in tf_group, the group the
    restore's chief chooses for, is 0 exactly where worker_info says it is the chief; the ranks are 0..n-1."""
    from candle_ckpt.distributed.cluster import worker_info  # noqa: PLC0415
    from candle_ckpt.distributed.tf_group import tf_group  # noqa: PLC0415

    cluster = {kind: [f"localhost:{1000 + 10 * i + j}" for j in range(n)] for i, (kind, n) in enumerate(tasks.items())}
    ranks = []
    for kind, n in tasks.items():
        for index in range(n):
            monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}))
            strategy = _NonChiefStrategy()  # a real TFConfigClusterResolver
            info = worker_info(strategy)
            group = tf_group(strategy, info.num_workers)
            assert (group.rank == 0) == info.is_chief, (kind, index, group.rank)
            ranks.append(group.rank)
    assert sorted(ranks) == list(range(sum(tasks.values())))
