"""A job preempted by a SIGTERM it sends itself, run by ``test_quick_exit.py`` in a fresh process.

``python quick_exit_job.py DIR MARKS [--catch]``: ``restart()``, then ``fit`` (the defaults: ``shuffle=True``,
validation data) of 3 epochs with ``CandleCheckpointCallback`` at its defaults; at batch 2 of epoch 2 a callback
sends this process SIGTERM (a real signal, handled by candle_ckpt's handler), so that the next batch end commits a
step checkpoint and ``fit`` raises ``PreemptExit``. Before ``fit`` the job leaves three witnesses of how it ends,
each writing a line to ``MARKS`` when it runs: an ``atexit`` handler (``atexit``), a file opened for writing with a
line in its buffer and never closed (``MARKS.buffered``: the line is there only if someone flushed it; and
``MARKS.gz``, a gzip file, readable only if someone closed it), and an
object whose ``__del__`` only the interpreter's teardown of this module calls (``teardown``). ``--catch``: the
script catches ``PreemptExit``, writes ``caught <status>`` and ends with ``sys.exit(0)``.
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def mark(
    path: str, line: str, _open=os.open, _write=os.write, _close=os.close, _flags=os.O_WRONLY | os.O_CREAT | os.O_APPEND
) -> None:
    """One line appended to ``path`` (all of ``os`` it needs bound at definition: the teardown may clear ``os``)."""
    fd = _open(path, _flags, 0o644)
    _write(fd, (line + "\n").encode())
    _close(fd)


class Teardown:
    """Marks ``teardown`` when freed: this module's global, so only the interpreter's teardown frees it."""

    def __init__(self, path: str) -> None:
        self.path, self.mark = path, mark  # the module's globals may be cleared first

    def __del__(self) -> None:
        self.mark(self.path, "teardown")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("marks")
    parser.add_argument("--catch", action="store_true")
    args = parser.parse_args()

    import keras
    import numpy as np

    import candle_ckpt
    from candle_ckpt.engine.preempt import PreemptExit

    global WITNESS
    WITNESS = Teardown(args.marks)
    atexit.register(mark, args.marks, "atexit")
    buffered = open(args.marks + ".buffered", "w")  # noqa: SIM115 (left open on purpose)
    buffered.write("buffered line\n")
    zipped = gzip.open(args.marks + ".gz", "wt")  # noqa: SIM115 (left open: only a close writes its trailer)
    zipped.write("zipped line\n")
    globals()["BUFFERED"], globals()["ZIPPED"] = buffered, zipped

    class Preempter(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 1 and batch == 2:
                os.kill(os.getpid(), 15)

    gp = {"ckpt_directory": args.directory, "epochs": 3}
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    rng = np.random.RandomState(0)
    x, y = rng.rand(96, 8).astype("float32"), rng.rand(96, 1).astype("float32")
    resumed = candle_ckpt.restart(gp, model)
    initial_epoch = resumed["epoch"] if resumed else 0
    callbacks = [candle_ckpt.CandleCheckpointCallback(gp), Preempter()]
    try:
        model.fit(x, y, epochs=3, batch_size=16, validation_split=0.25, verbose=0, callbacks=callbacks,
                  initial_epoch=initial_epoch)  # fmt: skip
    except PreemptExit as stop:
        if not args.catch:
            raise
        mark(args.marks, f"caught {stop.code}")
        sys.exit(0)
    mark(args.marks, "fit returned")


WITNESS = None
if __name__ == "__main__":
    main()
