"""The in-process walks of docs/architecture.rst: which modules an epoch-end save and ``restart()`` enter.

``python walk_job.py DIR FLOW OUT``, FLOW:

- ``save``: a fit of 2 epochs at the defaults (``shuffle=True``, validation data, the callback at its defaults);
  the window opens at the end of epoch 1 (before the checkpoint callback's ``on_epoch_end``) and closes at the
  beginning of epoch 2, once ckpt.log says epoch 1's checkpoint was saved (the background write included);
- ``restart``: ``restart()`` alone, in a fresh process, on DIR's checkpoints (run ``save`` first).

The modules entered are written to OUT, one a line (:mod:`module_walk`).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from module_walk import Walk, import_all  # noqa: E402


def main(directory: str, flow: str, out: str) -> None:
    import keras
    import numpy as np

    import candle_ckpt

    import_all()
    walk = Walk(out).install()
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1))).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    gp = {"ckpt_directory": directory, "epochs": 2}
    if flow == "restart":
        walk.start()
        candle_ckpt.restart(gp, model, logger=None)
        walk.stop()
        return
    log = os.path.join(directory, "ckpt.log")

    class Window(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None) -> None:
            if epoch == 0:
                walk.start()

        def on_epoch_begin(self, epoch, logs=None) -> None:
            if epoch != 1:
                return
            deadline = time.monotonic() + 120  # a small model's save; a bound, not a pace
            while time.monotonic() < deadline:
                with open(log) as f:
                    if "epoch 1: saved" in f.read():
                        break
                time.sleep(0.05)
            else:
                raise SystemExit("epoch 1's checkpoint was not saved within 120 s")
            time.sleep(0.5)  # what follows the line: pruning, the after-commit hooks
            walk.stop()

    candle_ckpt.restart(gp, model, logger=None)
    ckpt = candle_ckpt.CandleCheckpointCallback(gp, logger=None)
    split = (x[:32], y[:32])
    model.fit(x, y, batch_size=16, epochs=2, validation_data=split, verbose=0, callbacks=[Window(), ckpt])


if __name__ == "__main__":
    main(*sys.argv[1:4])
