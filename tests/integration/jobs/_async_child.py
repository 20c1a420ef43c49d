"""Child process for tests/integration/engine/test_async.py (not collected: no ``test_`` prefix).

Usage: ``python _async_child.py MODE DIR``, where DIR holds ``ckpt/`` (the
checkpoint directory) and the marker files the parent and child talk through.

Modes:
    kill: 6 epochs, async; the write of epoch 3 blocks after its data is
        written, before fsync (``DIR/blocked`` appears), until the parent kill -9s.
        ``CSVLogger(append=True)`` logs to ``DIR/train.csv`` (its row of epoch 3 is written by then).
    resume: restart() from ``DIR/ckpt``, continue to 6 epochs, then train a
        fresh model 6 epochs uninterrupted; both states go to ``DIR/result.npz``,
        the CSV rows to ``DIR/train.csv`` and ``DIR/reference.csv``.
    signal: 100 epochs, async, preemption signals off; the write of epoch 2 blocks
        (``DIR/blocked``) until ``DIR/go`` exists. The parent sends SIGTERM or SIGINT meanwhile.
    timeout: 2 epochs, async, ckpt_async_timeout=0.5; the write of epoch 2
        never ends, so the join at train end and the one at exit run out.
"""

from __future__ import annotations

import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from testkit import build_model  # noqa: E402

from candle_ckpt import CandleCheckpointCallback, restart  # noqa: E402
from candle_ckpt.core import layout as L  # noqa: E402
from candle_ckpt.core.fs import LocalFS  # noqa: E402

EPOCHS = 6


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(64, 8).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.3).astype("float32")


def state(model: keras.Model) -> list[np.ndarray]:
    return [np.array(w) for w in model.get_weights()] + [np.array(v.numpy()) for v in model.optimizer.variables]


class BlockingFS(LocalFS):
    """Blocks the writer thread at ``op`` of the state file of the ``nth`` commit."""

    def __init__(self, op: str, nth: int, marker: str, until=None) -> None:
        self.op, self.nth, self.marker, self.until = op, nth, marker, until
        self.commits = 0

    def hook(self, op: str, path: str) -> None:
        # The state file of a checkpoint: model.keras at the defaults used here.
        if not any(path.endswith(os.path.join("work", name)) for name in (L.MODEL_FILE, L.WEIGHTS_FILE)):
            return
        if op == "create":
            self.commits += 1
        if op == self.op and self.commits == self.nth:
            with open(self.marker, "w") as f:
                f.write(threading.current_thread().name)
            while self.until is None or not self.until():
                time.sleep(0.02)


def params(ckpt: str, epochs: int, **extra) -> dict:
    return {
        "ckpt_directory": ckpt,
        "epochs": epochs,
        "ckpt_async": True,
        "ckpt_save_interval": 1,
        "ckpt_save_best_metric": "loss",
        "ckpt_keep_limit": 100,
        **extra,
    }


def main() -> None:
    mode, root = sys.argv[1], sys.argv[2]
    ckpt = os.path.join(root, "ckpt")
    x, y = data()
    blocked = os.path.join(root, "blocked")
    if mode == "kill":
        fs = BlockingFS("fsync", 3, blocked)
        cb = CandleCheckpointCallback(params(ckpt, EPOCHS), verbose=False, fs=fs)
        csv = keras.callbacks.CSVLogger(os.path.join(root, "train.csv"), append=True)
        build_model(7).fit(x, y, epochs=EPOCHS, batch_size=16, shuffle=False, verbose=0, callbacks=[csv, cb])
        raise AssertionError("the parent should have killed this process")
    if mode == "resume":
        model = build_model(7)
        info = restart(params(ckpt, EPOCHS, ckpt_restart_mode="required"), model, verbose=False)
        cb = CandleCheckpointCallback(params(ckpt, EPOCHS), verbose=False)
        csv = keras.callbacks.CSVLogger(os.path.join(root, "train.csv"), append=True)
        start = info["epoch"]
        fit_args = {"epochs": EPOCHS, "initial_epoch": start, "batch_size": 16, "shuffle": False, "verbose": 0}
        model.fit(x, y, callbacks=[csv, cb], **fit_args)
        reference = build_model(7)
        csv = keras.callbacks.CSVLogger(os.path.join(root, "reference.csv"), append=True)
        reference.fit(x, y, epochs=EPOCHS, batch_size=16, shuffle=False, verbose=0, callbacks=[csv])
        arrays = {f"resumed_{i}": a for i, a in enumerate(state(model))}
        arrays.update({f"reference_{i}": a for i, a in enumerate(state(reference))})
        np.savez(os.path.join(root, "result.npz"), start_epoch=info["epoch"], **arrays)
        return
    if mode == "signal":
        fs = BlockingFS("fsync", 2, blocked, until=lambda: os.path.exists(os.path.join(root, "go")))
        # Preemption off: SIGTERM becomes SystemExit (the signal owner's exit phase) (with it on, docs/preemption.rst).
        cb = CandleCheckpointCallback(params(ckpt, 100, ckpt_preempt_signals="none"), verbose=False, fs=fs)
        build_model(7).fit(x, y, epochs=100, batch_size=16, shuffle=False, verbose=0, callbacks=[cb])
        raise AssertionError("the parent should have stopped this process")
    if mode == "timeout":
        fs = BlockingFS("fsync", 2, blocked)
        cb = CandleCheckpointCallback(params(ckpt, 2, ckpt_async_timeout=0.5), verbose=False, fs=fs)
        build_model(7).fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0, callbacks=[cb])
        print("fit returned", flush=True)
        return
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
