"""A Keras job for the crash-loop tests: ``restart()``, then ``fit`` with the callback, in a fresh process.

Usage::

    python loop_job.py DIR EPOCHS [--crash EPOCH:BATCH] [--sleep S] [--fast FAST] [--persistent URL] [--k K]
                       [--slow-drain S]

``--crash E:B`` raises ``RuntimeError("bad batch E:B")`` at batch B of epoch index E, in every process that
gets there (bad data at a fixed batch); ``--sleep`` sleeps S seconds after every batch (a job slow enough to
kill); ``--fast`` puts the fast tier in FAST instead of DIR (a run moved to a new node); ``--persistent`` sets
``ckpt_persistent_url``; ``--k`` sets ``ckpt_max_no_progress_restarts``; ``--slow-drain S`` makes
``slowfile://PATH`` a persistent tier: the local file system, each file opened for writing S seconds late (a slow
network store). A run that ends prints ``done`` and
``start=<stats()["start"] as JSON>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
from testkit import build_model, make_data  # noqa: E402

import candle_ckpt as candle  # noqa: E402


class CrashAt(keras.callbacks.Callback):
    """Raises at batch ``batch`` of epoch index ``epoch``; sleeps ``sleep`` seconds after every batch."""

    def __init__(self, epoch: int | None, batch: int | None, sleep: float) -> None:
        super().__init__()
        self.at, self.sleep, self.epoch = (epoch, batch), sleep, -1

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if (self.epoch, batch) == self.at:
            raise RuntimeError(f"bad batch {self.epoch}:{batch}")
        if self.sleep:
            time.sleep(self.sleep)


def slow_file_system(seconds: float) -> None:
    """Register ``slowfile://``: the local file system, each file opened for writing ``seconds`` late."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    class SlowFile(LocalFileSystem):
        protocol = ("slowfile",)

        @classmethod
        def _strip_protocol(cls, path):
            path = str(path)
            return super()._strip_protocol(path[len("slowfile://") :] if path.startswith("slowfile://") else path)

        def _open(self, path, mode="rb", **kwargs):
            if "w" in mode or "a" in mode:
                time.sleep(seconds)
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("slowfile", SlowFile, clobber=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--crash", default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--fast", default=None)
    parser.add_argument("--persistent", default=None)
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--slow-drain", type=float, default=None)
    args = parser.parse_args()
    if args.slow_drain is not None:
        slow_file_system(args.slow_drain)
    params = {
        "epochs": args.epochs,
        "ckpt_directory": args.fast or args.directory,
        "ckpt_save_best_metric": "loss",
        "ckpt_save_steps": 0,  # epoch checkpoints only: the crash's epoch commits nothing
    }
    if args.persistent:
        params.update(ckpt_persistent_url=args.persistent, ckpt_drain="every")
    if args.k is not None:
        params["ckpt_max_no_progress_restarts"] = args.k
    model = build_model()
    found = candle.restart(params, model, logger=None)
    epoch, batch = (int(n) for n in args.crash.split(":")) if args.crash else (None, None)
    checkpoint = candle.CandleCheckpointCallback(params, logger=None)
    x, y = make_data()
    initial = found["epoch"] if found else 0
    callbacks = [CrashAt(epoch, batch, args.sleep), checkpoint]
    model.fit(x, y, batch_size=16, epochs=args.epochs, initial_epoch=initial, verbose=0, callbacks=callbacks)
    print("done")
    print("start=" + json.dumps(checkpoint.stats()["start"]))


if __name__ == "__main__":
    main()
