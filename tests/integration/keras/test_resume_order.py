"""Issue 11 in one process: call order, all-or-nothing restores, callback state, loud exceptions.

A "new run" of a job inside this process is a new model (what ``restart()``
restored travels on the model object, so a new model starts clean) and a new
callback (the directory's writer lock is held only while ``fit`` runs).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gc  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import candle_ckpt as candle  # noqa: E402
from candle_ckpt.core.errors import ModelMismatch  # noqa: E402
from candle_ckpt.keras import (
    fit_hooks,  # noqa: E402
    fit_internals,  # noqa: E402
    pipeline_state,  # noqa: E402
)

X = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
Y = X.sum(axis=1, keepdims=True).astype("float32")


def _params(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    params = {"ckpt_directory": str(tmp_path / "save"), "epochs": 4, "ckpt_save_best_metric": "loss"}
    params.update(overrides)
    return params


def _model(width: int = 16, dropouts: int = 0, compiled: bool = True) -> keras.Model:
    keras.utils.set_random_seed(1)
    layers = [keras.Input((8,)), keras.layers.Dense(width, activation="relu")]
    layers += [keras.layers.Dropout(0.1, seed=i) for i in range(dropouts)]
    model = keras.Sequential([*layers, keras.layers.Dense(1)])
    if compiled:
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _train(params: dict[str, Any], model: keras.Model, epochs: int, initial_epoch: int = 0, extra=()) -> None:
    ckpt = candle.CandleCheckpointCallback(params, logger=None)
    model.fit(
        X, Y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0,
        callbacks=[*extra, ckpt],
    )  # fmt: skip


def _log(params: dict[str, Any]) -> str:
    return (Path(params["ckpt_directory"]) / "ckpt.log").read_text()


def _values(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in model.variables]


@pytest.mark.parametrize(
    ("width", "dropouts", "first"),
    [(64, 1, r"layers/dense/vars/0 \(\S+/kernel\): saved \(8, 32\) float32, model \(8, 64\) float32"),
     (32, 2, r"random-layer seed states: saved 1 \(\S+\), model 2")],
    ids=["wider-layer", "one-dropout-more"],
)  # fmt: skip
def test_a_mismatched_model_is_left_untouched_and_told_what_differs(tmp_path, width, dropouts, first):
    """restart() into a model that does not match raises a short ModelMismatch naming the checkpoint, epoch and
    first differing variables, and changes no variable of the model."""
    params = _params(tmp_path)
    _train(params, _model(width=32, dropouts=1), epochs=2)
    model = _model(width=width, dropouts=dropouts)
    before = _values(model)
    with pytest.raises(ModelMismatch, match=r"(?s)checkpoint .*epochs/002 \(epoch 2\) does not match the model") as e:
        candle.restart(params, model, logger=None)
    message = str(e.value)
    assert re.search(first, message), message
    assert "ckpt_restart_mode=off" in message and len(message) < 1000 and len(message.splitlines()) <= 6
    after = _values(model)
    assert len(before) == len(after) and all(a.tobytes() == b.tobytes() for a, b in zip(before, after, strict=True))
    assert int(model.optimizer.iterations.numpy()) == 0


def test_restart_before_compile_applies_the_optimizer_state_when_fit_starts(tmp_path):
    """restart() on an uncompiled model keeps the optimizer state; after compile() the callback applies it, so
    the resumed run ends bit-identical to an uninterrupted one."""
    ref_params = _params(tmp_path / "ref")
    reference = _model()
    _train(ref_params, reference, epochs=4)
    params = _params(tmp_path)
    _train(params, _model(), epochs=2)
    model = _model(compiled=False)
    found = candle.restart(params, model, logger=None)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    _train(params, model, epochs=4, initial_epoch=found["epoch"])
    assert int(model.optimizer.iterations.numpy()) == 16
    for a, b in zip(reference.variables + reference.optimizer.variables,
                    model.variables + model.optimizer.variables, strict=True):  # fmt: skip
        assert np.asarray(a.numpy()).tobytes() == np.asarray(b.numpy()).tobytes(), a.path
    assert "applied the optimizer state of" in _log(params)


def test_optimizer_state_never_applied_is_reported_loudly(tmp_path, capfd):
    """restart() before compile() and no callback ever starting a fit: a warning says the optimizer state was
    never applied (when the model is collected, or at exit)."""
    params = _params(tmp_path)
    _train(params, _model(), epochs=1)
    model = _model(compiled=False)
    candle.restart(params, model, logger=None)
    del model
    gc.collect()
    assert "was never applied" in _log(params)
    assert "was never applied" in capfd.readouterr().err


def test_callback_created_before_restart_continues_best_tracking(tmp_path):
    """The candle_lib order (callback, then restart()) adopts what restart() restored: resumed_from is recorded,
    best continues from the checkpoint and the checkpoint resumed from is not pruned."""
    params = _params(tmp_path, ckpt_keep_limit=1)
    _train(params, _model(), epochs=2)
    model = _model()
    ckpt = candle.CandleCheckpointCallback(params, logger=None)
    found = candle.restart(params, model, logger=None)
    model.fit(X, Y, batch_size=16, epochs=4, initial_epoch=found["epoch"], shuffle=False, verbose=0, callbacks=[ckpt])
    side = ckpt.engine.store.read_sidecar(4)
    assert side.resumed_from == 2
    assert 2 in ckpt.engine.store.epochs()


def test_initial_epoch_at_or_beyond_epochs_is_reported(tmp_path):
    """restart() restores epoch 3 but fit(epochs=2): one warning names both numbers, that nothing is trained
    and how to train on; the checkpoint it names exists."""
    params = _params(tmp_path)
    _train(params, _model(), epochs=3)
    model = _model()
    found = candle.restart(params, model, logger=None)
    _train(params, model, epochs=2, initial_epoch=found["epoch"])
    log = _log(params)
    where = Path(params["ckpt_directory"]) / "ckpts" / "epochs" / "003"
    expected = (
        f"the run is finished: its checkpoint is of epoch 3 and fit() was called with epochs=2 ({where}); "
        "this fit() trains nothing; to train on, pass epochs > 3"
    )
    assert [line for line in log.splitlines() if "run is finished" in line or "no epoch" in line] == [
        line for line in log.splitlines() if line.endswith(expected)
    ]
    assert expected in log and where.is_dir()


class Counter(keras.callbacks.Callback):
    """A callback with state across epochs, offering the get_state()/set_state() protocol."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.seen_at_first_begin: int | None = None

    def on_train_begin(self, logs=None) -> None:
        self.seen_at_first_begin = None

    def on_epoch_begin(self, epoch, logs=None) -> None:
        if self.seen_at_first_begin is None:
            self.seen_at_first_begin = self.count

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.count += 1

    def get_state(self) -> dict:
        return {"count": self.count, "history": np.arange(self.count)}

    def set_state(self, state: dict) -> None:
        self.count = int(state["count"])
        assert state["history"].tolist() == list(range(self.count))


def test_get_state_set_state_protocol_round_trips_before_the_first_epoch(tmp_path):
    """A callback with get_state()/set_state() (placed after ours) gets its state of the saved epoch back before
    the resumed fit's first on_epoch_begin."""
    params = _params(tmp_path)
    model, ckpt, counter = _model(), candle.CandleCheckpointCallback(params, logger=None), Counter()
    model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[ckpt, counter])
    model, counter = _model(), Counter()
    found = candle.restart(params, model, logger=None)
    _train(params, model, epochs=4, initial_epoch=found["epoch"], extra=[counter])
    assert (counter.seen_at_first_begin, counter.count) == (2, 4)


def test_a_callback_without_saved_state_and_a_generator_input_are_named_once(tmp_path):
    """An unknown callback with attributes of its own and no get_state/set_state, and a Python generator as
    input, each get one warning naming them and what to do; a callback without attributes gets none."""

    class Mystery(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None) -> None:
            self.last = epoch

    def batches():
        while True:
            yield X[:16], Y[:16]

    params = _params(tmp_path)
    model = _model()
    ckpt = candle.CandleCheckpointCallback(params, logger=None)

    class Quiet(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None) -> None:
            pass

    model.fit(batches(), steps_per_epoch=2, epochs=3, verbose=0, callbacks=[Mystery(), Quiet(), ckpt])
    log = _log(params)
    assert "callback Quiet" not in log
    assert log.count("callback Mystery has attributes (last) but no get_state()/set_state()") == 1
    assert log.count("the training input (fit's x) is a Python generator") == 1


def test_fit_hooks_find_the_callback_list_and_the_input():
    """Tripwire for the Keras and TensorFlow internals the exact resume relies on: in a real fit the callback
    finds its CallbackList and the epoch iterator, and the private RNG states exist."""
    found: dict[str, Any] = {}

    class Probe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None) -> None:
            found["list"] = fit_hooks.find_callback_list(self)
            found["iterator"] = fit_hooks.find_epoch_iterator(self.model)
            found.setdefault("validates", []).append(fit_internals.validated_epochs(self.model))

    probe = Probe()
    _model().fit(X, Y, batch_size=16, epochs=1, verbose=0, callbacks=[probe])
    assert found["list"] is not None and probe in found["list"].callbacks
    # Which epochs fit validates (engine/capture.HeldStep): none without validation data; validation_split and
    # validation_freq=2 validate epochs 2, 4...
    _model().fit(X, Y, batch_size=16, epochs=1, verbose=0, callbacks=[probe], validation_split=0.25, validation_freq=2)
    assert found["validates"][0] is None
    assert [found["validates"][1](epoch) for epoch in range(4)] == [False, True, False, True]
    iterator = found["iterator"]
    assert type(iterator.data_adapter).__name__ == "ArrayDataAdapter"
    assert fit_internals.batch_size(iterator) == 16  # a resume with another batch size is told (engine/epoch_shape)
    for name in ("_get_iterator", "_current_iterator", "_steps_seen", "steps_per_epoch"):
        assert hasattr(iterator, name), name
    keras.utils.set_random_seed(5)
    doc, arrays = pipeline_state.capture_rngs()
    assert "tf_op_seed" in doc, "TensorFlow's eager context no longer draws op seeds from context._rng"
    expected = (random.random(), float(np.random.random()))
    pipeline_state.restore_rngs(doc, arrays)
    assert (random.random(), float(np.random.random())) == expected


def _tfk_model(compiled: bool = True):
    import tf_keras

    tf_keras.utils.set_random_seed(1)
    model = tf_keras.Sequential(
        [tf_keras.Input((8,)), tf_keras.layers.Dense(16, activation="relu"), tf_keras.layers.Dense(1)]
    )
    if compiled:
        model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    return model


def _tfk_fit(params: dict[str, Any], model, epochs: int, initial_epoch: int = 0) -> None:
    from candle_ckpt.tf_keras.adapter import CandleCheckpointCallback

    ckpt = CandleCheckpointCallback(params, logger=None)
    model.fit(
        X, Y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0, callbacks=[ckpt]
    )


def test_tf_keras_restart_before_compile_resumes_bit_identical(tmp_path):
    """A tf_keras model: restart() before compile() loads the weights without raising, the tf_keras callback
    applies the optimizer state when fit starts, and the run ends bit-identical to an uninterrupted one."""
    reference = _tfk_model()
    _tfk_fit(_params(tmp_path / "ref"), reference, epochs=4)
    params = _params(tmp_path)
    _tfk_fit(params, _tfk_model(), epochs=2)
    model = _tfk_model(compiled=False)
    found = candle.restart(params, model, logger=None)
    assert found["epoch"] == 2
    import tf_keras

    model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    _tfk_fit(params, model, epochs=4, initial_epoch=2)
    assert int(model.optimizer.iterations.numpy()) == 16
    mine = model.get_weights() + [v.numpy() for v in model.optimizer.variables]
    ref = reference.get_weights() + [v.numpy() for v in reference.optimizer.variables]
    assert len(mine) == len(ref) and all(a.tobytes() == b.tobytes() for a, b in zip(mine, ref, strict=True))
    assert "applied the optimizer state of" in _log(params)


def test_an_uncheckpointable_tf_data_iterator_is_named_and_saving_goes_on(tmp_path):
    """A repeat()ed Dataset.from_generator cannot be checkpointed: one warning says the resumed run will start it
    from its beginning, and every epoch is still saved."""
    import tensorflow as tf

    def rows():
        yield from zip(X, Y, strict=True)

    spec = (tf.TensorSpec((8,), tf.float32), tf.TensorSpec((1,), tf.float32))
    ds = tf.data.Dataset.from_generator(rows, output_signature=spec).repeat().batch(16)
    params = _params(tmp_path)
    ckpt = candle.CandleCheckpointCallback(params, logger=None)
    _model().fit(ds, steps_per_epoch=3, epochs=2, verbose=0, callbacks=[ckpt])
    assert ckpt.engine.store.epochs() == [1, 2]
    assert _log(params).count("the position of the tf.data iterator cannot be saved") == 1


def test_every_global_rng_state_round_trips():
    """Python's, NumPy's, TensorFlow's global generator and op-seed counter, and Keras's global SeedGenerator
    continue after a restore with the numbers they would have drawn."""
    import tensorflow as tf
    from tensorflow.python.framework import random_seed

    keras.utils.set_random_seed(7)
    tf.random.get_global_generator().reset_from_seed(3)
    keras.random.normal((2,))  # creates Keras's global SeedGenerator

    def draw() -> list[bytes]:
        return [
            np.float64(random.random()).tobytes(),
            np.random.random(3).tobytes(),
            tf.random.get_global_generator().normal((3,)).numpy().tobytes(),
            # The op seed the next unseeded random op gets (its kernel would be new in a fresh process).
            np.asarray(random_seed.get_seed(None)).tobytes(),
            np.asarray(keras.random.normal((3,))).tobytes(),
        ]

    doc, arrays = pipeline_state.capture_rngs()
    assert {"python", "numpy", "tf_global", "tf_op_seed", "keras"} <= set(doc)
    expected = draw()
    assert draw() != expected
    assert sorted(pipeline_state.restore_rngs(doc, arrays)) == ["keras", "numpy", "python", "tf_global", "tf_op_seed"]
    assert draw() == expected


def test_model_checkpoint_best_continues_after_a_resume(tmp_path):
    """Keras's ModelCheckpoint(save_best_only=True) gets its best value back, so the resumed run does not save
    a worse model as 'best'."""
    params = _params(tmp_path)
    path = str(tmp_path / "best.keras")
    first = keras.callbacks.ModelCheckpoint(path, monitor="loss", save_best_only=True)
    model = _model()
    model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[candle.CandleCheckpointCallback(params, logger=None), first])  # fmt: skip
    model = _model()
    found = candle.restart(params, model, logger=None)
    second = keras.callbacks.ModelCheckpoint(path, monitor="loss", save_best_only=True)
    seen: dict[str, float] = {}

    class Peek(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None) -> None:
            seen.setdefault("best", second.best)

    _train(params, model, epochs=3, initial_epoch=found["epoch"], extra=[second, Peek()])
    assert seen["best"] == first.best


def test_integer_counters_of_another_width_fit_but_other_dtypes_do_not(tmp_path) -> None:
    """A step counter saved as int32 (JAX) loads into int64 (TensorFlow) and back when its value fits;
    a float of another width, or an integer that does not fit, is a mismatch."""
    import h5py

    from candle_ckpt.keras.preflight import _dtype_fits

    with h5py.File(tmp_path / "d.h5", "w") as h5:
        h5["small"] = np.array(7, dtype="int32")
        h5["big"] = np.array(2**40, dtype="int64")
        h5["half"] = np.zeros(3, dtype="float16")
        assert _dtype_fits(h5["small"], "int64") and _dtype_fits(h5["small"], "int32")
        assert not _dtype_fits(h5["big"], "int32")
        assert _dtype_fits(h5["big"], "int64")
        assert not _dtype_fits(h5["half"], "float32")


def test_a_run_early_stopping_ended_trains_on_when_its_epoch_is_asked_for(tmp_path):
    """The documented way to continue a finished run on purpose: ckpt_restart_epoch=N resumes from the epoch
    EarlyStopping ended the run after, and fit trains on (no 'finished' line for that rerun)."""
    params = _params(tmp_path, epochs=8)
    stop = keras.callbacks.EarlyStopping("loss", patience=1, min_delta=1e6)
    _train(params, _model(), epochs=8, extra=[stop])
    stopped = stop.stopped_epoch + 1
    assert 1 < stopped < 8
    model = _model()
    found = candle.restart(params | {"ckpt_restart_epoch": stopped}, model, logger=None)
    assert found["epoch"] == stopped
    history = model.fit(
        X, Y, batch_size=16, epochs=8, initial_epoch=stopped, shuffle=False, verbose=0,
        callbacks=[keras.callbacks.EarlyStopping("loss", patience=3, min_delta=1e6),
                   candle.CandleCheckpointCallback(params | {"ckpt_restart_epoch": stopped}, logger=None)],
    )  # fmt: skip
    assert len(history.epoch) >= 1
    assert _log(params).count("the run is finished") == 0
