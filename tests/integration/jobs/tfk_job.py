"""A tf_keras (Keras 2) training job run by ``test_tfk_exactness.py`` in fresh processes, without tf.distribute.

Served like ``exact_job.py`` (one forked child per stdin line ``SETUP PHASE DIR OUT``). Every setup calls
``fit`` with its defaults (``shuffle=True``) and validation data. ``plain``: Dense layers; ``generator``: a
``Dropout`` layer, after ``tf_keras.backend.experimental.enable_tf_random_generator()``; ``defaults``: a
``Dropout`` layer as it comes (TF1 stateful kernels); ``mirrored``: ``generator`` under a
``MirroredStrategy`` of 2 logical CPUs (fit distributes its input); ``early_stopping``: ``plain`` with an
``EarlyStopping`` after the checkpoint callback that ends the run after epoch 3 of 5; ``plateau``: ``plain``
with an ``EarlyStopping`` (patience 3, ends the run after epoch 4, in the middle of its patience at the kill) and a
``ReduceLROnPlateau`` (patience 1, halves the rate after epochs 2, 3 and 4: a resumed run needs its best loss and
the rate it set); ``no_initial_epoch``: ``plain`` with ``fit`` not given ``initial_epoch``; ``sequence``: a
``tf_keras.utils.Sequence`` that shuffles its index in place with ``np.random.shuffle`` and draws a target shift
from TensorFlow's global generator in ``on_epoch_end`` (fit also shuffles its batch order with Python's
``random``). PHASE ``kill`` sends itself SIGKILL after the second batch of epoch 3, once epoch 2's checkpoint is
committed; ``full`` and ``resume`` run to the end, write the final weights, optimizer variables and learning
rate to OUT and print ``done START ran N`` (N: the epochs this fit began).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from exact_job import BATCH, EPOCHS, KILL_AT, data, say, serve  # noqa: E402


def run(words: list[str]) -> None:
    """Run one job (see the module docstring)."""
    import numpy as np
    import tf_keras

    import candle_ckpt
    from candle_ckpt.tf_keras.adapter import CandleCheckpointCallback

    setup, phase, directory, out = words[:4]
    if setup in ("generator", "mirrored"):
        tf_keras.backend.experimental.enable_tf_random_generator()
    scope = contextlib.nullcontext()
    if setup == "mirrored":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        scope = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope()
    tf_keras.utils.set_random_seed(1)
    layers = [tf_keras.Input((8,)), tf_keras.layers.Dense(16, activation="relu")]
    layers += [tf_keras.layers.Dropout(0.2)] if setup in ("defaults", "generator", "mirrored") else []
    with scope:
        model = tf_keras.Sequential([*layers, tf_keras.layers.Dense(1)])
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="mse")
    params = {"epochs": EPOCHS, "ckpt_directory": directory, "ckpt_save_best_metric": "loss"}
    found = candle_ckpt.restart(params, model, logger=None)
    start = found["epoch"] if found else 0
    say(f"start {start}")

    class KillMidEpoch(tf_keras.callbacks.Callback):
        ran = 0

        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.epoch = epoch
            self.ran += 1

        def on_train_batch_end(self, batch, logs=None) -> None:
            if phase == "kill" and self.epoch + 1 == KILL_AT and batch == 1:
                # The epoch before is written in the background (ckpt_async=auto): these tests resume after it,
                # so the kill waits (bounded) for its commit.
                for _ in range(600):
                    if any(s["epoch"] == KILL_AT - 1 for s in ckpt.stats()["saves"]):
                        break
                    time.sleep(0.1)
                os.kill(os.getpid(), signal.SIGKILL)

    x, y, _ = data()
    x, y, val = x[:-10], y[:-10], (x[-10:], y[-10:])  # 54 samples: the last batch is a partial one
    kill = KillMidEpoch()
    ckpt = CandleCheckpointCallback(params, logger=None)
    callbacks = [kill, ckpt]
    if setup in ("early_stopping", "plateau"):  # no loss is ever 1e9 better than the first: patience runs out
        callbacks.append(
            tf_keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=setup_patience(setup))
        )
    if setup == "plateau":
        callbacks.append(tf_keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=1e9, patience=1, factor=0.5))
    inputs = {"x": x, "y": y, "batch_size": BATCH}
    if setup == "sequence":
        inputs = {"x": shuffling_sequence(x, y)}
    first = {"initial_epoch": start} if setup != "no_initial_epoch" else {}  # a script that forgot it
    model.fit(**inputs, epochs=EPOCHS, **first, verbose=0, callbacks=callbacks, validation_data=val)
    arrays = {f"w{i}": np.asarray(v) for i, v in enumerate(model.get_weights())}
    arrays.update({f"opt{i}": np.asarray(v.numpy()) for i, v in enumerate(model.optimizer.variables)})
    arrays["lr"] = np.asarray(model.optimizer.learning_rate.numpy())
    np.savez(out, **arrays)
    say(f"done {start} ran {kill.ran}")


def setup_patience(setup: str) -> int:
    """EarlyStopping's patience: 2 ends ``early_stopping`` after epoch 3, 3 ends ``plateau`` after epoch 4."""
    return 3 if setup == "plateau" else 2


def shuffling_sequence(x, y):
    """A ``Sequence`` of 3 batches that shuffles its index in place at every epoch end (most Keras 2 examples)
    and shifts the targets by a number drawn from TensorFlow's global generator."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    tf.random.set_global_generator(tf.random.Generator.from_seed(7))

    class Shuffling(tf_keras.utils.Sequence):
        def __init__(self) -> None:
            self.index = np.random.permutation(len(x))[: 3 * BATCH]
            self.shift = 0.0

        def __len__(self) -> int:
            return 3

        def __getitem__(self, i):
            rows = self.index[i * BATCH : (i + 1) * BATCH]
            return x[rows], y[rows] + self.shift

        def on_epoch_end(self) -> None:
            np.random.shuffle(self.index)  # depends on every earlier shuffle
            self.shift = float(tf.random.get_global_generator().uniform(()))

    return Shuffling()


if __name__ == "__main__":
    import tf_keras  # noqa: F401  (imported once, inherited by every child)

    serve(run)
