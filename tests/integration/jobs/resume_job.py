"""A training job run in a fresh process by the integration tests.

Usage::

    python resume_job.py train DIR EPOCHS OUT.npz [--dropout]
        restart() from DIR (auto), train to EPOCHS with the checkpoint
        callback, save the final weights and optimizer variables to OUT.npz
        and print "initial_epoch=N".
    python resume_job.py hold DIR
        take the writer lock of DIR the way the callback does (through the
        checkpoint engine, without importing keras), print "LOCKED" and sleep
        until killed.

The test imports :func:`build_model` and :func:`make_data` from this file, so
the job and the uninterrupted reference run build exactly the same model.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build_model(*, dropout: bool = False, seed: int = 1):
    """Return a compiled Dense 8 -> 16 (-> Dropout) -> 1 model with Adam, seeded."""
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((8,)), keras.layers.Dense(16, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(0.3, seed=3))
    layers.append(keras.layers.Dense(1))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    return model


def make_data():
    """Return 64 seeded samples ``(x, y)`` of 8 features and one target."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1)) + 0.1 * rng.standard_normal((64, 1))).astype("float32")
    return x, y


def job_params(directory: str, epochs: int) -> dict:
    """The gParameters of the job: checkpoint every epoch, best on ``loss``."""
    return {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_best_metric": "loss"}


def state_arrays(model) -> dict:
    """The model's weights and its optimizer's variables as named numpy arrays."""
    import numpy as np

    out = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    out.update({f"opt{i}": np.asarray(v.numpy()) for i, v in enumerate(model.optimizer.variables)})
    return out


def train(directory: str, epochs: int, out: str, dropout: bool) -> None:
    import numpy as np

    import candle_ckpt as candle

    params = job_params(directory, epochs)
    model = build_model(dropout=dropout)
    found = candle.restart(params, model, verbose=False)
    initial_epoch = found["epoch"] if found else 0
    ckpt = candle.CandleCheckpointCallback(params, verbose=False)
    x, y = make_data()
    model.fit(
        x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0, callbacks=[ckpt]
    )
    np.savez(out, **state_arrays(model))
    print(f"initial_epoch={initial_epoch}", flush=True)


def hold(directory: str) -> None:
    from candle_ckpt.config.params import CkptConfig
    from candle_ckpt.core.layout import Layout
    from candle_ckpt.core.log import OpsLog
    from candle_ckpt.engine.engine import CheckpointEngine

    cfg = CkptConfig.from_params(job_params(directory, 10))
    engine = CheckpointEngine(cfg, OpsLog(Layout.at(directory).log))  # holds the lock while it lives
    print("LOCKED", flush=True)
    while engine.store.is_open:
        time.sleep(60)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], int(sys.argv[3]), sys.argv[4], "--dropout" in sys.argv[5:])
    elif sys.argv[1] == "hold":
        hold(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
