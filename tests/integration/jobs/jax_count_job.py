"""One process of an N-process JAX job that counts every call candle_ckpt makes to the coordination service.

Usage (JaxJob's arguments; DIST is always DataParallel, one CPU device per process)::

    python jax_count_job.py dp DIR EPOCHS OUT PORT RANK NPROC

The coordination client is wrapped in a counting proxy before ``restart()``; the job then runs
``restart()``, a ``fit`` of EPOCHS epochs of 100 steps (a checkpoint at every epoch end), and a second
``fit`` of one epoch with a second callback (names must not collide). It writes ``OUT.json``:

- ``restore``: calls made by this process during ``restart()`` (a restore meeting);
- ``quiet``: calls from the training thread, and from every thread, between steps 10 and 90 of the
  second epoch (no save, no request: the protocol must say nothing);
- ``save``: calls between step 99 of the second epoch and step 1 of the third (one save meeting);
- ``mid_keys``: keys under ``candle_ckpt/`` at step 50 of the second epoch (rank 0);
- ``end_keys``: keys under ``candle_ckpt/`` once every process has ended both fits (rank 0).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter

os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_NUM_CPU_DEVICES"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

STEPS, FEATURES, BATCH = 100, 8, 2


class CountingClient:
    """The coordination client, with every method call counted by name and by thread."""

    def __init__(self, client) -> None:
        self._client = client
        self.calls: Counter[str] = Counter()
        self.by_thread: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with self._lock:
                self.calls[name] += 1
                self.by_thread[threading.current_thread().name] += 1
            return attr(*args, **kwargs)

        return call

    def total(self) -> int:
        return sum(self.calls.values())

    def main(self) -> int:
        return self.by_thread["MainThread"]


def main() -> None:
    _, directory, epochs, out, port, rank, nproc = sys.argv[1:8]
    rank, nproc, epochs = int(rank), int(nproc), int(epochs)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", nproc, rank)
    jax.devices()  # the CPU backend's gloo collectives take the raw client: made before the proxy
    from jax._src import distributed

    raw = distributed.global_state.client
    counting = distributed.global_state.client = CountingClient(raw)

    import keras
    import numpy as np

    import candle_ckpt

    keras.utils.set_random_seed(1)
    dist = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    dist.auto_shard_dataset = False
    keras.distribution.set_distribution(dist)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    # Sync saves: the "save" window below must hold the whole meeting, which ckpt_async=auto would run on the
    # writer thread, past the window's end.
    params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_interval": 1, "ckpt_keep_limit": 2,
              "ckpt_save_best_metric": "loss", "ckpt_async": False}  # fmt: skip
    report: dict = {"rank": rank, "size": nproc}

    before = counting.total()
    candle_ckpt.restart(params, model, verbose=False)
    report["restore"] = counting.total() - before

    class Probe(keras.callbacks.Callback):
        """Reads the counts at fixed steps (placed after CandleCheckpointCallback)."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            if epoch == 2:
                report["save"] = counting.total() - report.pop("save_from")

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch != 1:
                return
            if batch == 9:
                self.main, self.all = counting.main(), counting.total()
            elif batch == 49 and rank == 0:
                report["mid_keys"] = [k for k, _ in raw.key_value_dir_get("candle_ckpt/")]
            elif batch == 89:
                report["quiet"] = {"main": counting.main() - self.main, "all": counting.total() - self.all}
            elif batch == STEPS - 1:
                report["save_from"] = counting.total()

    rng = np.random.default_rng(rank)
    x = rng.standard_normal((STEPS * BATCH, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    cb = candle_ckpt.CandleCheckpointCallback(params, verbose=False)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, callbacks=[cb, Probe()], verbose=0, shuffle=False)
    second = candle_ckpt.CandleCheckpointCallback({**params, "epochs": epochs + 1}, verbose=False)
    model.fit(x, y, batch_size=BATCH, epochs=epochs + 1, initial_epoch=epochs, callbacks=[second], verbose=0)
    raw.wait_at_barrier("count-job-end", 120_000)
    if rank == 0:
        report["end_keys"] = [k for k, _ in raw.key_value_dir_get("candle_ckpt/")]
    report["calls"] = dict(counting.calls)
    with open(out + ".json", "w") as f:
        json.dump(report, f)
    raw.wait_at_barrier("count-job-written", 120_000)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
