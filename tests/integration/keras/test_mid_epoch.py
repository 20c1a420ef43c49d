"""Issue 16 inside one process: the epoch-iterator skip a mid-epoch resume relies on, and step checkpoints in fit."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from testkit import build_model, make_data  # noqa: E402

from candle_ckpt.keras import fit_hooks  # noqa: E402
from candle_ckpt.keras.callback import CandleCheckpointCallback  # noqa: E402
from candle_ckpt.keras.restart import restart  # noqa: E402

X, Y = make_data(n=64)


class Batches(keras.callbacks.Callback):
    """Records (epoch, batch) of every batch end, and the first batch's inputs of each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.seen.append((self.epoch, batch))


def test_skip_steps_takes_the_first_steps_of_one_epoch_only():
    """Tripwire for the Keras internals of a mid-epoch resume: wrapping the epoch iterator's
    _enumerate_iterator skips the first steps of the next epoch only, step numbers continue, and the
    skipped batches are drawn (the input's position moves as if they had been trained on)."""
    found: dict[str, Any] = {}

    class Skip(keras.callbacks.Callback):
        def on_train_begin(self, logs=None) -> None:
            iterator = fit_hooks.find_epoch_iterator(self.model)
            for name in ("_enumerate_iterator", "_steps_seen", "steps_per_execution"):
                assert hasattr(iterator, name), name
            fit_hooks.skip_steps(iterator, 3, True, lambda done, s: found.setdefault("done", done))

    batches = Batches()
    build_model(0).fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[Skip(), batches])
    assert found["done"] == 3
    assert batches.seen == [(0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]


@pytest.mark.parametrize("async_save", ["auto", False])
def test_save_steps_writes_step_checkpoints_that_the_epoch_commit_supersedes(tmp_path, async_save):
    """ckpt_save_steps=3 with 8 steps per epoch saves after steps 3 and 6 (one kept at a time), each epoch commit
    removes it, and stats() records every step save beside the epoch saves. Synchronous, each commit is done when
    its step (or epoch) ends; asynchronous (the default), the writer commits each during the steps after it, one at a
    time (the next save waits for it), so a step may see the new one renamed in before the old one is removed."""
    params = {"ckpt_directory": str(tmp_path), "epochs": 2, "ckpt_save_best_metric": "loss", "ckpt_save_steps": 3}
    params["ckpt_async"] = async_save
    seen = []

    class Look(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None) -> None:
            steps = tmp_path / "ckpts" / "steps"
            seen.append(len(list(steps.iterdir())) if steps.is_dir() else 0)

    ckpt = CandleCheckpointCallback(params, logger=None)
    build_model(0).fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[ckpt, Look()])
    if async_save is False:
        assert seen == [0, 0, 1, 1, 1, 1, 1, 1] * 2
    else:
        assert seen[:2] == [0, 0] and max(seen) <= 2 and 1 in seen[2:8] and 1 in seen[10:], seen
    assert not list((tmp_path / "ckpts" / "steps").iterdir())
    saves = ckpt.stats()["saves"]
    assert [(s["epoch"], s.get("step")) for s in saves] == [(0, 3), (0, 6), (1, None), (1, 3), (1, 6), (2, None)]
    assert ckpt.stats()["preempt"] is None


def test_restart_from_a_step_checkpoint_in_process_is_exact(tmp_path):
    """A fit stopped after a step checkpoint (stop at step 5 of epoch 2) and resumed with restart() + fit in the
    same process ends with the weights and optimizer variables of an uninterrupted fit."""
    params = {"ckpt_directory": str(tmp_path / "a"), "epochs": 3, "ckpt_save_best_metric": "loss"}
    params["ckpt_preempt_exit_code"] = "return"  # fit returns after the step checkpoint

    def fit(p: dict, callbacks: list, initial_epoch: int = 0) -> keras.Model:
        model = build_model(0)
        found = restart(p, model, logger=None)
        model.fit(X, Y, batch_size=8, epochs=3, initial_epoch=found["epoch"] if found else initial_epoch,
                  shuffle=True, verbose=0, callbacks=callbacks)  # fmt: skip
        return model

    full = fit(params, [CandleCheckpointCallback(params, logger=None)])
    resumed = {**params, "ckpt_directory": str(tmp_path / "b")}
    ckpt = CandleCheckpointCallback(resumed, logger=None)

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None) -> None:
            if (self.epoch, batch) == (1, 4):
                ckpt.run.controller.watcher.trigger("test")

    keras.utils.set_random_seed(0)
    fit(resumed, [Stop(), ckpt])
    assert ckpt.stats()["preempt"]["step"] == 5
    again = CandleCheckpointCallback(resumed, logger=None)
    model = fit(resumed, [again])
    assert again.stats()["load"]["skipped_steps"] == 5
    for a, b in zip(full.optimizer.variables + full.weights, model.optimizer.variables + model.weights, strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), a.path


def test_without_preemption_the_batch_hook_is_keras_default(tmp_path):
    """With signals, deadline, step saves and the hang watchdog all off, the callback keeps Keras's default batch
    hook (so fit may dispatch batch hooks asynchronously); with the defaults it has its own."""
    from keras.src.utils.python_utils import is_default

    off = {"ckpt_directory": str(tmp_path), "epochs": 1, "ckpt_preempt_signals": "none", "ckpt_deadline": "none"}
    off["ckpt_save_steps"] = 0  # auto (the default) needs the hook too
    off["ckpt_hang_timeout"] = "none"  # the watchdog (the default) too
    auto = CandleCheckpointCallback({**off, "ckpt_save_steps": "auto", "ckpt_directory": str(tmp_path / "a")}, None)
    assert not is_default(auto.on_train_batch_end)
    assert is_default(CandleCheckpointCallback(off, logger=None).on_train_batch_end)
    on = CandleCheckpointCallback({"ckpt_directory": str(tmp_path / "on"), "epochs": 1}, logger=None)
    assert not is_default(on.on_train_batch_end)


def test_a_fit_that_raises_gives_the_signal_handlers_back(tmp_path):
    """When fit raises (another callback's error), the watcher's handlers are replaced by the previous ones
    on the main thread soon after: the fit guard interrupts it to do so."""
    import signal
    import time

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None) -> None:
            raise RuntimeError("boom")

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ckpt = CandleCheckpointCallback({"ckpt_directory": str(tmp_path), "epochs": 1}, logger=None)
    with pytest.raises(RuntimeError, match="boom"):
        build_model(0).fit(X, Y, batch_size=16, epochs=1, verbose=0, callbacks=[ckpt, Boom()])
    for _ in range(200):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            break
        time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert ckpt.run.controller.watcher.pending is None
