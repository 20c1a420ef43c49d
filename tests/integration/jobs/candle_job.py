"""A training script in the shape of ECP-CANDLE's benchmarks, run unchanged by the kill tests.

Usage::

    python candle_job.py master|develop|uno WORKDIR EPOCHS OUT.npz

``master`` is Benchmarks master's shape (NT3, Uno, ST1): ``restart(gParameters,
model)`` before ``model.compile()``, ``best_metric_last`` fed back as
``ckpt_best_metric_last``, then ``CandleCheckpointCallback``. ``develop`` is
candle_lib develop's: ``CandleCkptKeras`` made first, ``set_model``,
``restart(model)``, compile, fit, ``report_final()``. Both put ``CSVLogger``,
``ReduceLROnPlateau`` and a ``TerminateOnTimeOut``-style callback in the list
before the checkpoint callback, as the benchmarks do. ``uno`` is Uno's
(Benchmarks develop, ``Pilot1/Uno/uno_baseline_keras2.py``) call for call:
``CandleCkptKeras(params)``, ``set_model(template_model)``, ``J = ckpt.restart(params)``
(the parameter dict, before compile), a ``Sequence`` input shuffled in place at
every epoch end, ``EarlyStopping``, ``ReduceLROnPlateau``, a learning-rate
warm-up and ``MultiGPUCheckpoint("model.h5", save_best_only=True)``; the data
are synthetic.

It prints ``ready N`` after restart and ``committed N`` after each epoch's
checkpoint (written with ``os.write``, so a line that was printed is in the
pipe whatever kills the process next), then saves the final weights and
optimizer variables to OUT.npz.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import candle_ckpt as candle  # noqa: E402  (the one-line import swap: was `import candle`)


def say(message: str) -> None:
    os.write(1, (message + "\n").encode())


class TerminateOnTimeOut(keras.callbacks.Callback):
    """candle_lib's TerminateOnTimeOut, in shape: stop training once ``timeout`` seconds have passed."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout
        self.start = 0.0

    def on_train_begin(self, logs=None) -> None:
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None) -> None:
        if time.time() - self.start > self.timeout:
            self.model.stop_training = True


class Progress(keras.callbacks.Callback):
    """Report each committed epoch, then pause a little so that a kill can land mid-run."""

    def on_epoch_end(self, epoch, logs=None) -> None:
        say(f"committed {epoch + 1}")
        time.sleep(0.3)


class StepProgress(Progress):
    """Uno's with ``CANDLE_JOB_STEP_SLEEP=S`` in the environment: also report each batch (``batch E:B``) and sleep
    S seconds after it, so that a signal can land in the middle of an epoch."""

    def __init__(self, sleep: float) -> None:
        super().__init__()
        self.sleep, self.epoch = sleep, 0

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None) -> None:
        say(f"batch {self.epoch}:{batch}")
        time.sleep(self.sleep)


def build_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation=None)]
    )


def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1)) + 0.1 * rng.standard_normal((64, 1))).astype("float32")
    return x, y


def other_callbacks(workdir: str) -> list:
    return [
        keras.callbacks.CSVLogger(os.path.join(workdir, "training.log")),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=10, min_delta=1e-4),
        TerminateOnTimeOut(3600),
    ]


def compile_model(model) -> None:
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")


def run_master(gParameters: dict, workdir: str):
    model = build_model()
    initial_epoch = 0
    J = candle.restart(gParameters, model)
    if J is not None:
        initial_epoch = J["epoch"]
        best_metric_last = J["best_metric_last"]
        gParameters["ckpt_best_metric_last"] = best_metric_last
    ckpt = candle.CandleCheckpointCallback(gParameters, verbose=False)
    compile_model(model)
    say(f"ready {initial_epoch}")
    x, y = data()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=gParameters["epochs"],
        initial_epoch=initial_epoch,
        shuffle=False,
        verbose=0,
        callbacks=[*other_callbacks(workdir), ckpt, Progress()],
    )
    return model


def run_develop(gParameters: dict, workdir: str):
    model = build_model()
    initial_epoch = 0
    ckpt = candle.CandleCkptKeras(gParameters, verbose=False)
    ckpt.set_model(model)
    J = ckpt.restart(model)
    if J is not None:
        initial_epoch = J["epoch"]
    compile_model(model)
    say(f"ready {initial_epoch}")
    x, y = data()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=gParameters["epochs"],
        initial_epoch=initial_epoch,
        shuffle=False,
        verbose=0,
        callbacks=[*other_callbacks(workdir), ckpt, Progress()],
    )
    ckpt.report_final()
    return model


class Feeder(keras.utils.Sequence):
    """Uno's data generator in shape: an index shuffled in place at construction and at every epoch end."""

    def __init__(self, x, y, batch_size: int, shuffle: bool) -> None:
        super().__init__()
        self.x, self.y, self.batch_size, self.shuffle = x, y, batch_size, shuffle
        self.index = np.arange(len(x))
        if shuffle:
            np.random.shuffle(self.index)

    def __len__(self) -> int:
        return len(self.x) // self.batch_size

    def __getitem__(self, i):
        rows = self.index[i * self.batch_size : (i + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self) -> None:
        if self.shuffle:
            np.random.shuffle(self.index)


def run_uno(params: dict, workdir: str):
    template_model = build_model()
    initial_epoch = 0
    ckpt = candle.CandleCkptKeras(params, verbose=True)
    ckpt.set_model(template_model)
    J = ckpt.restart(params)
    resumed = ckpt.engine.resumed  # what this callback adopted (the tests read it)
    if J is not None:
        initial_epoch = J["epoch"]
        best_metric_last = J["best_metric_last"]
        params["ckpt_best_metric_last"] = best_metric_last
        print(f"initial_epoch: {initial_epoch}", file=sys.stderr)
    model = template_model
    optimizer = keras.optimizers.deserialize({"class_name": "adam", "config": {}})
    base_lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    model.compile(loss="mse", optimizer=optimizer, metrics=["mae"])

    def warmup_scheduler(epoch):
        lr = base_lr * 16 / 100 * 10
        if epoch <= 5:
            model.optimizer.learning_rate.assign((base_lr * (5 - epoch) + lr * epoch) / 5)
        return float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))

    es_monitor = keras.callbacks.EarlyStopping(patience=10, verbose=0)
    reduce_lr = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=5, min_lr=0.00001)
    warmup_lr = keras.callbacks.LearningRateScheduler(warmup_scheduler)
    checkpointer = candle.MultiGPUCheckpoint(os.path.join(workdir, "model.h5"), save_best_only=True)
    step_sleep = float(os.environ.get("CANDLE_JOB_STEP_SLEEP", "0"))
    progress = StepProgress(step_sleep) if step_sleep else Progress()
    callbacks = [TerminateOnTimeOut(3600), ckpt, es_monitor, reduce_lr, warmup_lr, checkpointer, progress]
    x, y = data()
    train_gen = Feeder(x[:48], y[:48], 16, shuffle=True)
    val_gen = Feeder(x[48:], y[48:], 16, shuffle=False)
    say(f"ready {initial_epoch}")
    if resumed is not None:
        say(f"adopted epoch={resumed.epoch} step={resumed.step} generation={resumed.generation} J.step={J['step']}")
    model.fit(
        train_gen,
        epochs=params["epochs"],
        initial_epoch=initial_epoch,
        callbacks=callbacks,
        validation_data=val_gen,
        verbose=0,
    )
    return model


def main(generation: str, workdir: str, epochs: int, out: str) -> None:
    gParameters = {
        "epochs": epochs,
        "output_dir": workdir,
        "ckpt_save_best_metric": "loss",
        "ckpt_save_interval": 1,
        "ckpt_directory": os.path.join(workdir, "save") if generation == "master" else None,
    }
    model = {"master": run_master, "develop": run_develop, "uno": run_uno}[generation](gParameters, workdir)
    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    arrays.update({f"opt{i}": np.asarray(v.numpy()) for i, v in enumerate(model.optimizer.variables)})
    np.savez(out, **arrays)
    say("done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
