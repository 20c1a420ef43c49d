"""The writer lock is held only while a writer exists: during fit, and never after it.

In a notebook, or a script that trains and then calls the CLI, ``candle-ckpt
rollback`` and ``prune`` must work in the same Python process once ``fit`` has
returned, or once it has raised.
"""

from __future__ import annotations

import gc
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from testkit import build_model, make_data, make_params  # noqa: E402

import candle_ckpt as candle  # noqa: E402
from candle_ckpt.cli.main import main as cli  # noqa: E402
from candle_ckpt.core.errors import DirectoryLocked  # noqa: E402
from candle_ckpt.storage.store import CheckpointStore  # noqa: E402

X, Y = make_data()


def fit(model: keras.Model, cb, epochs: int, initial_epoch: int = 0, extra: list | None = None, x=X) -> None:
    model.fit(
        x if x is not None else X,
        None if isinstance(x, keras.utils.PyDataset) else Y,
        epochs=epochs,
        initial_epoch=initial_epoch,
        batch_size=16,
        shuffle=False,
        verbose=0,
        callbacks=[cb, *(extra or [])],
    )


def lock_is_free(directory: str) -> bool:
    """True if a new writer (another store of this process) can take the lock at once."""
    store = CheckpointStore(directory)
    try:
        store._lock.acquire(wait_same_process_s=0)
    except DirectoryLocked:
        return False
    store.close()
    return True


def wait_until_free(directory: str, seconds: float = 20.0) -> bool:
    """Whether the lock becomes free within ``seconds``, asked without waiting (no writer notices anything)."""
    deadline = time.monotonic() + seconds
    while not lock_is_free(directory):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Boom(keras.callbacks.Callback):
    """Another callback that raises at the end of the second epoch."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("boom in another callback")


class Probe(keras.callbacks.Callback):
    """Records, at each epoch end, whether the directory's lock was held by the running fit."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory
        self.free_during_fit: list[bool] = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.free_during_fit.append(lock_is_free(self.directory))


def test_cli_rollback_and_prune_work_in_the_same_process_after_fit(tmp_path: Path, capsys) -> None:
    """Train, then run `candle-ckpt rollback` and `prune` through main() in this process: both succeed."""
    params = make_params(tmp_path, epochs=4)
    d = params["ckpt_directory"]
    cb = candle.CandleCheckpointCallback(params, logger=None)
    probe = Probe(d)
    fit(build_model(), cb, 4, extra=[probe])
    assert probe.free_during_fit == [False] * 4  # held while fit ran
    assert cli(["rollback", d, "2"]) == 0
    assert cli(["prune", d, "--keep-limit", "1"]) == 0
    out = capsys.readouterr()
    assert "in use by another writer" not in out.err
    store = CheckpointStore(d)
    assert store.link_epoch("last") == 2
    assert 3 not in store.epochs() and 2 in store.epochs()


def test_a_fit_that_raises_in_another_callback_releases_the_lock(tmp_path: Path) -> None:
    """An exception from another callback ends fit without on_train_end; the lock is released all the same."""
    params = make_params(tmp_path, epochs=4)
    cb = candle.CandleCheckpointCallback(params, logger=None)
    with pytest.raises(RuntimeError, match="boom in another callback"):
        fit(build_model(), cb, 4, extra=[Boom()])
    assert cli(["rollback", params["ckpt_directory"], "1"]) == 0  # waits at most 5 s for the watchdog
    assert lock_is_free(params["ckpt_directory"])


def test_a_fit_that_raised_lets_go_of_the_lock_with_the_garbage_collector_off(tmp_path: Path) -> None:
    """The watchdog learns that fit ended when fit's CallbackList dies: nothing of ours may hold it in a
    reference cycle (a hook wrapper stored on the list), or the lock stays until a garbage collection."""
    params = make_params(tmp_path, epochs=4)
    cb = candle.CandleCheckpointCallback(params, logger=None)
    model = build_model()
    gc.collect()
    gc.disable()
    try:
        try:
            fit(model, cb, 4, extra=[Boom()])
        except RuntimeError:
            pass
        assert wait_until_free(params["ckpt_directory"]), "the lock was kept after fit raised"
    finally:
        gc.enable()
    assert CheckpointStore(params["ckpt_directory"]).epochs() == [1]


def test_a_kept_error_does_not_block_the_next_cell(tmp_path: Path, capsys) -> None:
    """A notebook keeps the last exception (sys.last_value): fit's frame, and so its CallbackList, live on and
    the directory stays locked to other threads and processes. The next cell runs on the thread that ran fit,
    and a writer there sees that fit is over: a new callback trains on, and the CLI's rollback works."""
    params = make_params(tmp_path, epochs=4)
    d = params["ckpt_directory"]
    with pytest.raises(RuntimeError, match="boom in another callback") as kept:
        fit(build_model(), candle.CandleCheckpointCallback(params, logger=None), 4, extra=[Boom()])
    time.sleep(0.5)
    assert not lock_is_free(d)  # no writer has looked yet (docs/guarantees.rst says so)
    model = build_model()
    candle.restart(params, model)
    fit(model, candle.CandleCheckpointCallback(params, logger=None), 3, initial_epoch=1)
    assert CheckpointStore(d).epochs() == [1, 2, 3]
    assert cli(["rollback", d, "2"]) == 0
    assert "in use by another writer" not in capsys.readouterr().err
    assert kept.value is not None


def test_a_fit_whose_data_raises_mid_epoch_releases_the_lock(tmp_path: Path) -> None:
    """An error inside the training loop itself (the data pipeline) also leaves the directory unlocked."""
    params = make_params(tmp_path, epochs=4)

    class Data(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i):
            self.calls += 1
            if self.calls > 6:  # in the second epoch
                raise OSError("the data file went away")
            return X[i * 16 : (i + 1) * 16], Y[i * 16 : (i + 1) * 16]

    cb = candle.CandleCheckpointCallback(params, logger=None)
    with pytest.raises(Exception, match="the data file went away"):  # TF wraps it (UnknownError)
        fit(build_model(), cb, 4, x=Data())
    store = CheckpointStore(params["ckpt_directory"])
    store.open_for_write()  # a same-process holder gets 2 s to let go: the watchdog needs a fraction of that
    store.close()
    assert store.epochs() == [1]


def test_our_own_error_releases_the_lock_at_once(tmp_path: Path) -> None:
    """When the callback itself raises (a missing metric), the lock is released before the error leaves fit."""
    params = make_params(tmp_path, epochs=3, ckpt_save_best_metric="val_loss")
    cb = candle.CandleCheckpointCallback(params, logger=None)
    with pytest.raises(ValueError, match="val_loss"):
        fit(build_model(), cb, 3)
    assert lock_is_free(params["ckpt_directory"])  # no grace period needed


def test_two_fits_in_a_row_take_the_lock_again(tmp_path: Path) -> None:
    """The same callback in a second fit holds the lock again while it trains, and gives it back after."""
    params = make_params(tmp_path, epochs=4)
    d = params["ckpt_directory"]
    cb = candle.CandleCheckpointCallback(params, logger=None)
    assert lock_is_free(d)  # creating the callback checked the directory and let go
    model = build_model()
    first, second = Probe(d), Probe(d)
    fit(model, cb, 2, extra=[first])
    assert lock_is_free(d)
    fit(model, cb, 4, initial_epoch=2, extra=[second])
    assert first.free_during_fit == [False, False] and second.free_during_fit == [False, False]
    assert lock_is_free(d)
    assert CheckpointStore(d).epochs() == [1, 2, 3, 4]
    assert [s["epoch"] for s in cb.stats()["saves"]] == [1, 2, 3, 4]


def test_a_running_fit_refuses_a_second_writer_of_this_process(tmp_path: Path) -> None:
    """While fit runs, another callback on the same directory is refused with DirectoryLocked saying so."""
    params = make_params(tmp_path, epochs=2)
    refused: list[str] = []

    class Second(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            with pytest.raises(DirectoryLocked, match="another writer in this same process") as err:
                candle.CandleCheckpointCallback(params, logger=None)
            refused.append(str(err.value))

    cb = candle.CandleCheckpointCallback(params, logger=None)
    fit(build_model(), cb, 1, extra=[Second()])
    assert len(refused) == 1 and params["ckpt_directory"] in refused[0]
    assert np.isfinite(cb.stats()["saves"][0]["bytes"])


def test_a_subclass_whose_hook_calls_super_holds_the_lock_for_the_whole_fit(tmp_path: Path) -> None:
    """A callback subclass overriding on_train_begin (as CandleCkptKeras does) keeps the lock until fit ends."""

    class Mine(candle.CandleCheckpointCallback):
        def on_train_begin(self, logs=None) -> None:
            super().on_train_begin(logs)

    params = make_params(tmp_path, epochs=3)
    d = params["ckpt_directory"]
    probe = Probe(d)
    fit(build_model(), Mine(params, logger=None), 3, extra=[probe])
    assert probe.free_during_fit == [False] * 3
    assert CheckpointStore(d).epochs() == [1, 2, 3]
    assert lock_is_free(d)


def test_a_callback_that_forwards_its_hooks_to_ours_keeps_the_lock_for_the_whole_fit(tmp_path: Path) -> None:
    """A user's wrapper callback that calls our hooks (instead of listing ours in fit) saves every epoch."""

    class Forwarding(keras.callbacks.Callback):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def set_model(self, model) -> None:
            super().set_model(model)
            self.inner.set_model(model)

        def on_train_begin(self, logs=None) -> None:
            self.inner.on_train_begin(logs)

        def on_epoch_end(self, epoch, logs=None) -> None:
            self.inner.on_epoch_end(epoch, logs)

        def on_train_end(self, logs=None) -> None:
            self.inner.on_train_end(logs)

    params = make_params(tmp_path, epochs=3)
    d = params["ckpt_directory"]
    fit(build_model(), Forwarding(candle.CandleCheckpointCallback(params, logger=None)), 3)
    assert CheckpointStore(d).epochs() == [1, 2, 3]
    assert lock_is_free(d)


def test_a_commit_after_the_lock_was_released_names_who_released_it(tmp_path: Path) -> None:
    """A store whose lock another thread let go: the commit's error names that thread and its calls (issue 27: the
    lock seen released mid-fit three times, cause unconfirmed; the next occurrence says who did it)."""
    import threading

    from candle_ckpt.core.errors import CheckpointError

    store = CheckpointStore(tmp_path / "job")
    store.open_for_write()
    releaser = threading.Thread(target=store.close, name="candle_ckpt-fit-guard")
    releaser.start()
    releaser.join()
    with pytest.raises(CheckpointError, match=r"released by thread candle_ckpt-fit-guard: .*threading\.py:\d+ run"):
        store.take_generation("commit()")
