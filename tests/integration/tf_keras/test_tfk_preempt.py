"""The tf_keras callback's preemption save in one process (the two-worker tests are in test_mw_preempt.py)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import candle_ckpt as candle  # noqa: E402
import candle_ckpt.tf_keras.adapter as ck_tfk  # noqa: E402

pytestmark = pytest.mark.tf_only

STEPS = 4  # batches per epoch


def _dataset(skip: int = 0) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16 * STEPS, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).skip(skip)


def _model() -> tf_keras.Model:
    tf_keras.utils.set_random_seed(1)
    layers = tf_keras.layers
    model = tf_keras.Sequential([tf_keras.Input((8,)), layers.Dense(16, activation="relu"), layers.Dense(1)])
    model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    return model


def _state(model) -> list[np.ndarray]:
    return [np.asarray(w) for w in model.get_weights()] + [v.numpy() for v in model.optimizer.variables]


def _assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


class SignalAt(tf_keras.callbacks.Callback):
    """Sends SIGTERM to this process after batch ``batch`` of epoch ``epoch`` (after the checkpoint's hook)."""

    def __init__(self, epoch: int, batch: int) -> None:
        super().__init__()
        self.at, self.epoch = (epoch, batch), 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_the_next_step_stops_fit_and_the_rest_ends_bit_identical(tmp_path: Path) -> None:
    """SIGTERM after batch 1 of epoch 1: the next step (3 of epoch 1) is saved, then fit raises SystemExit(143)
    (the default: 128 + SIGTERM) with SIGTERM's default action back; restart() returns epoch 1 step 3 with
    that state, and fitting the rest of epoch 1, then epoch 2, ends bit-identical to an uninterrupted run."""
    params = {"ckpt_directory": str(tmp_path / "ckpt"), "epochs": 3, "ckpt_save_best_metric": "loss"}
    ref = _model()
    ref.fit(_dataset(), epochs=3, verbose=0)

    model = _model()
    cb = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    with pytest.raises(SystemExit) as exit_:
        model.fit(_dataset(), epochs=3, verbose=0, callbacks=[cb, SignalAt(1, 1)])
    assert exit_.value.code == 143 and cb.stats()["preempt"]["exit_code"] == 143
    assert cb.preempted == (1, 3)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    stopped = _state(model)

    again = _model()
    found = candle.restart(params, again, verbose=False)
    assert (found["epoch"], found["step"]) == (1, 3)
    _assert_same(_state(again), stopped)
    cb2 = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    again.fit(_dataset(3), epochs=2, initial_epoch=1, verbose=0, callbacks=[cb2])
    again.fit(_dataset(), epochs=3, initial_epoch=2, verbose=0, callbacks=[cb2])
    assert cb2.preempted is None
    _assert_same(_state(again), _state(ref))


def test_a_signal_at_an_epochs_last_step_is_answered_by_that_epochs_checkpoint(tmp_path: Path) -> None:
    """SIGTERM after the last batch of epoch 0: no step checkpoint; epoch 1's checkpoint is saved, then fit stops
    and returns (ckpt_preempt_exit_code=return)."""
    params = {"ckpt_directory": str(tmp_path / "ckpt"), "epochs": 3, "ckpt_save_best_metric": "loss"}
    params["ckpt_preempt_exit_code"] = "return"
    cb = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    _model().fit(_dataset(), epochs=3, verbose=0, callbacks=[cb, SignalAt(0, STEPS - 1)])
    assert cb.preempted == (1, 0)
    assert [s["epoch"] for s in cb.stats()["saves"]] == [1]
    assert candle.restart(params, _model(), verbose=False)["epoch"] == 1


def test_a_sequence_resumed_from_a_mid_epoch_checkpoint_is_said_once(tmp_path: Path) -> None:
    """A fit on a shuffling Sequence preempted in epoch 1 and resumed from that step checkpoint: its RNGs and
    the Sequence's attributes are restored from epoch checkpoints only, and ckpt.log says so once, with the
    remedy."""

    class Shuffling(tf_keras.utils.Sequence):
        def __init__(self) -> None:
            x, y = (np.concatenate(a) for a in zip(*_dataset().as_numpy_iterator(), strict=True))
            self.x, self.y, self.index = x, y, np.arange(len(x))

        def __len__(self) -> int:
            return STEPS

        def __getitem__(self, i):
            rows = self.index[i * 16 : (i + 1) * 16]
            return self.x[rows], self.y[rows]

        def on_epoch_end(self) -> None:
            np.random.shuffle(self.index)

    params = {"ckpt_directory": str(tmp_path / "ckpt"), "epochs": 3, "ckpt_save_best_metric": "loss"}
    params["ckpt_preempt_exit_code"] = "return"
    cb = ck_tfk.CandleCheckpointCallback(params, verbose=False)
    _model().fit(Shuffling(), epochs=3, verbose=0, callbacks=[cb, SignalAt(1, 1)])
    assert cb.preempted == (1, 3)
    again = _model()
    assert candle.restart(params, again, verbose=False)["step"] == 3
    again.fit(Shuffling(), epochs=3, initial_epoch=1, verbose=0, callbacks=[ck_tfk.CandleCheckpointCallback(params)])
    said = [line for line in (tmp_path / "ckpt" / "ckpt.log").read_text().splitlines() if "mid-epoch" in line]
    assert len(said) == 1 and said[0].endswith(
        "/ckpt/ckpts/steps/002 is a mid-epoch checkpoint: the global RNGs and the attributes of the Sequence "
        "Shuffling are put back only from epoch checkpoints, so this fit reads and draws otherwise than an "
        "uninterrupted run; for an exact resume, resume from the last epoch checkpoint (ckpt_restart_epoch)"
    ), said
