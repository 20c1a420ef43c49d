"""A tf_keras (Keras 2) training job run by ``test_tfk_exactness.py`` in fresh processes, without tf.distribute.

Served like ``exact_job.py`` (one forked child per stdin line ``SETUP PHASE DIR OUT``). Every setup calls
``fit`` with its defaults (``shuffle=True``) and validation data. ``plain``: Dense layers; ``generator``: a
``Dropout`` layer, after ``tf_keras.backend.experimental.enable_tf_random_generator()``; ``defaults``: a
``Dropout`` layer as it comes (TF1 stateful kernels); ``mirrored``: ``generator`` under a
``MirroredStrategy`` of 2 logical CPUs (fit distributes its input); ``early_stopping``: ``plain`` with an
``EarlyStopping`` after the checkpoint callback that ends the run after epoch 3 of 5. PHASE ``kill`` sends
itself SIGKILL after the second batch of epoch 3; ``full`` and ``resume`` run to the end, write the final
weights and optimizer variables to OUT and print ``done START ran N`` (N: the epochs this fit began).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

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
                os.kill(os.getpid(), signal.SIGKILL)

    x, y, _ = data()
    x, y, val = x[:-10], y[:-10], (x[-10:], y[-10:])  # 54 samples: the last batch is a partial one
    kill = KillMidEpoch()
    callbacks = [kill, CandleCheckpointCallback(params, logger=None)]
    if setup == "early_stopping":  # no loss is ever 1e9 better than the first: stops once patience runs out
        callbacks.append(tf_keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=2))
    model.fit(
        x, y, batch_size=BATCH, epochs=EPOCHS, initial_epoch=start, verbose=0, callbacks=callbacks, validation_data=val
    )
    arrays = {f"w{i}": np.asarray(v) for i, v in enumerate(model.get_weights())}
    arrays.update({f"opt{i}": np.asarray(v.numpy()) for i, v in enumerate(model.optimizer.variables)})
    np.savez(out, **arrays)
    say(f"done {start} ran {kill.ran}")


if __name__ == "__main__":
    import tf_keras  # noqa: F401  (imported once, inherited by every child)

    serve(run)
