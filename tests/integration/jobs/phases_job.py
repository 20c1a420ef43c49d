"""A job that trains in two phases, the way Keras's transfer-learning guide does (``test_phases.py``).

Phase 1 trains a new head on a frozen base (Adam 1e-2, epochs 1-3); phase 2 unfreezes the base, compiles the model
again with Adam 1e-4 and trains epochs 4-7. ``fit`` at its defaults (``shuffle=True``), validation data, Dropout,
another callback (``ReduceLROnPlateau``) before ours.

``python phases_job.py DIR OUT [options]``:

* ``--layout per-phase`` (docs/exactness.rst's recipe: ``DIR/phase1`` and ``DIR/phase2``, ``restart()`` after each
  phase's ``compile()``) or ``one`` (``DIR`` for both fits, one ``restart()`` before the first);
* ``--trainable``: the base is trainable in both phases (the optimizer's variables keep their shapes; only the
  learning rate changes);
* ``--kill-at E:B``: SIGKILL this process after batch B of epoch E (1-based, counted over both phases), once the
  checkpoint of epoch E - 1 is committed (written in the background: at most 60 s);
* ``--save-steps N``: ``ckpt_save_steps`` (a step checkpoint every N steps, written in the background); the kill
  then waits until a step checkpoint of its epoch is committed (its ``ckpt-info.json``: at most 60 s);
* ``--compile-after-restart``: phase 1 compiles the model once more after its ``restart()`` (a script that
  compiles twice).

Prints ``RESUMED phase<i> <epoch or None>`` after each ``restart()``; writes every weight and phase 2's optimizer
variables to ``OUT`` (``.npz``) at the end.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import candle_ckpt  # noqa: E402

HEAD_EPOCHS, EPOCHS = 3, 7


class KillAt(keras.callbacks.Callback):
    """SIGKILL this process after batch ``batch`` of epoch ``epoch`` (1-based): no grace, nothing flushed. First wait
    for the checkpoint of the epoch before (``directory``'s, or a phase's in it) and, with ``steps`` (a glob of step
    checkpoints' sidecars), for a step checkpoint that was not there when the epoch began."""

    def __init__(self, epoch: int, batch: int, directory: str, steps: str | None) -> None:
        super().__init__()
        self.epoch, self.batch, self.now, self.steps, self.before = epoch, batch, 0, steps, set()
        self.last = os.path.join(directory, "**", "ckpts", "epochs", f"{epoch - 1:03d}", "ckpt-info.json")

    def committed(self) -> set[str]:
        return set(glob.glob(self.steps, recursive=True)) if self.steps else set()

    def waiting(self) -> bool:
        return (self.epoch > 1 and not glob.glob(self.last, recursive=True)) or (
            self.steps is not None and not self.committed() - self.before
        )

    def on_epoch_begin(self, epoch, logs=None):
        self.now = epoch + 1
        self.before = self.committed()

    def on_train_batch_end(self, batch, logs=None):
        if (self.now, batch + 1) != (self.epoch, self.batch):
            return
        deadline = time.monotonic() + 60
        while self.waiting() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("out")
    parser.add_argument("--layout", choices=("per-phase", "one"), default="per-phase")
    parser.add_argument("--trainable", action="store_true")
    parser.add_argument("--kill-at")
    parser.add_argument("--save-steps", type=int, default=None)
    parser.add_argument("--compile-after-restart", action="store_true")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(256, 1))).astype("float32")
    keras.utils.set_random_seed(1)
    base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu")], name="base")
    model = keras.Sequential([base, keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    steps = os.path.join(args.directory, "**", "steps", "*", "ckpt-info.json") if args.save_steps else None
    kill = [KillAt(*map(int, args.kill_at.split(":")), args.directory, steps)] if args.kill_at else []

    found, start = None, 0
    for phase, (trainable, rate, last) in enumerate([(args.trainable, 1e-2, HEAD_EPOCHS), (True, 1e-4, EPOCHS)], 1):
        base.trainable = trainable
        model.compile(optimizer=keras.optimizers.Adam(rate), loss="mse")
        where = args.directory if args.layout == "one" else os.path.join(args.directory, f"phase{phase}")
        params = {"ckpt_directory": where, "epochs": last}
        if args.save_steps is not None:
            params["ckpt_save_steps"] = args.save_steps
        if phase == 1 or args.layout == "per-phase":
            found = candle_ckpt.restart(params, model)
            print(f"RESUMED phase{phase} {found['epoch'] if found else None}", flush=True)
            if args.compile_after_restart and phase == 1:
                model.compile(optimizer=keras.optimizers.Adam(rate), loss="mse")
        first = found["epoch"] if found else start
        if args.layout == "one":
            first = max(first, start)  # one directory: the epoch restored may be of either phase
        callbacks = [keras.callbacks.ReduceLROnPlateau(patience=1), candle_ckpt.CandleCheckpointCallback(params)]
        model.fit(
            x, y, batch_size=16, validation_split=0.25, epochs=last, initial_epoch=first, callbacks=callbacks + kill
        )
        start = last
    arrays = [np.asarray(v) for v in model.weights] + [np.asarray(v) for v in model.optimizer.variables]
    np.savez(args.out, *arrays)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
