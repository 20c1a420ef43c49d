"""A worker of the distributed tests, run as a real process (one per TF_CONFIG task).

Usage::

    python dist_job.py KIND DIR EPOCHS OUT.npz [--pause-at E:B] [--pause-in-commit E] [--pause-in-temp E]
                       [--corrupt-read REL] [--count]

KIND:
    ``mirrored``  Keras 3 ``model.fit`` under MirroredStrategy on 2 logical CPUs
                  (one process), with ``candle_ckpt.CandleCheckpointCallback``.
    ``k3``        Keras 3 custom training loop (``strategy.run`` of a
                  GradientTape step) under MultiWorkerMirroredStrategy, through
                  ``candle_ckpt.JobRunner(strategy=...)`` with ``ckpt_async``
                  (writes on the background writer, chief and non-chief).
    ``tfk``       tf_keras ``model.fit`` under MultiWorkerMirroredStrategy with
                  ``candle_ckpt.CandleCheckpointCallback`` (run with
                  ``TF_USE_LEGACY_KERAS=1``: the script only says ``tf.keras``).

The job restores (every worker: the chief's choice), prints
``RESTORED epoch=N``, saves the restored weights to ``OUT.restored.npz``,
trains to EPOCHS, and saves the final weights and optimizer variables to OUT.

``--pause-at E:B`` prints ``PAUSED`` after batch B (0-based) of epoch E
(0-based) and sleeps, so that the test kills this process with SIGKILL in mid-epoch.
``--pause-in-commit E`` / ``--pause-in-temp N`` print ``IN-COMMIT`` /
``IN-TEMP`` in the middle of a save and sleep there (see :func:`pausing_fs`),
for a kill during a save.

``--corrupt-read REL`` (a non-chief): this worker reads the file ``DIR/REL`` with one byte flipped, as a node
whose copy went bad would; the file on disk, which the chief reads, stays intact (see :func:`corrupt_read`).
``--count`` counts every call candle_ckpt makes to TensorFlow's coordination service during ``restart()`` and
writes ``OUT.count.json``: the calls by operation, and the keys set during the restore that are still in the
service once every worker has finished (see :class:`Counting`).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# A worker that hangs is asked for every thread's stack before it is killed (cluster.py's Cluster.kill_hung)
faulthandler.register(signal.SIGUSR2, all_threads=True)

N, FEATURES, GLOBAL_BATCH = 64, 8, 16


def make_data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, FEATURES)).astype("float32")
    y = (x @ rng.standard_normal((FEATURES, 1)) + 0.1 * rng.standard_normal((N, 1))).astype("float32")
    return x, y


def dataset(skip: int = 0, take: int = N):
    """The same global batches, in the same order, on every worker (no sharding: the data is tiny), from sample
    ``skip`` on."""
    import tensorflow as tf

    x, y = make_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).skip(skip).take(take).batch(GLOBAL_BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def pause(tag: str) -> None:
    print(tag, flush=True)
    time.sleep(600)  # the test kills us long before this
    raise SystemExit(f"{tag}: the test did not kill this process")


def parse_pause(argv: list[str]) -> tuple[tuple[int, int] | None, dict[str, int]]:
    at, saves = None, {}
    if "--pause-at" in argv:
        e, b = argv[argv.index("--pause-at") + 1].split(":")
        at = (int(e), int(b))
    for flag in ("--pause-in-commit", "--pause-in-temp"):
        if flag in argv:
            saves[flag] = int(argv[argv.index(flag) + 1])
    return at, saves


def pausing_fs(saves: dict[str, int]):
    """LocalFS that stops this worker in the middle of a save.

    ``--pause-in-commit E`` (chief): after checkpoint E's files are complete in
    ``ckpts/work``, just before the rename into ``epochs/``.
    ``--pause-in-temp N`` (non-chief): in its N-th scratch save, once
    ``model.weights.h5`` is written into ``.tmp-worker-<index>/`` and the next
    file is being created.
    """
    from candle_ckpt.core import layout as L
    from candle_ckpt.core.fs import LocalFS

    commit_epoch = saves.get("--pause-in-commit")
    temp_save = saves.get("--pause-in-temp")

    class PausingFS(LocalFS):
        temp_saves = 0

        def hook(self, op: str, path: str) -> None:
            name = os.path.basename(path)
            if commit_epoch is not None and op == "rename" and name == L.epoch_name(commit_epoch):
                pause("IN-COMMIT")
            if op == "mkdir" and name.startswith(".tmp-worker-"):
                self.temp_saves += 1
            if op == "create" and name != L.WEIGHTS_FILE and ".tmp-worker-" in path and self.temp_saves == temp_save:
                pause("IN-TEMP")

    return PausingFS()


def corrupt_read(target: str) -> None:
    """Every verification in this process reads ``target`` with one byte flipped (a copy in a temporary file): its
    CRC check fails here only, as on a node whose copy of a shared file went bad."""
    import shutil
    import tempfile

    from candle_ckpt.storage import reader

    original = reader.verify_file

    def verify_file(path, *args, **kwargs):
        if os.path.abspath(path) != os.path.abspath(target):
            return original(path, *args, **kwargs)
        bad = os.path.join(tempfile.mkdtemp(), os.path.basename(path))
        shutil.copyfile(path, bad)
        with open(bad, "r+b") as f:
            f.seek(os.path.getsize(bad) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        print(f"CORRUPT-READ {target}", flush=True)
        return original(bad, *args, **kwargs)

    reader.verify_file = verify_file


class Counting:
    """TensorFlow's coordination service as candle_ckpt reaches it (``tf_group.coordination_context``), with every
    call counted while :attr:`phase` is ``"restore"``, and the keys set then remembered."""

    def __init__(self) -> None:
        from candle_ckpt.distributed import tf_group

        self.raw = tf_group.coordination_context
        self.phase, self.calls, self.keys = "", {}, []
        tf_group.coordination_context = lambda: self

    def _count(self, op: str) -> None:
        if self.phase == "restore":
            self.calls[op] = self.calls.get(op, 0) + 1

    def set_config_key_value(self, key, value):
        self._count("set")
        if self.phase == "restore":
            self.keys.append(key)
        return self.raw().set_config_key_value(key, value)

    def get_config_key_value(self, key, timeout_ms):
        self._count("get")
        return self.raw().get_config_key_value(key, timeout_ms)

    def delete_config_key_value(self, key):
        self._count("delete")
        return self.raw().delete_config_key_value(key)

    def report(self, strategy, out: str) -> None:
        """Once every worker is past its restore (a barrier of its own, not counted): which of the keys this
        worker set are still there; written with the counts to ``OUT.count.json``."""
        import json

        from candle_ckpt.core.store_group import StoreGroup
        from candle_ckpt.distributed.tf_group import TfStore, tf_group

        self.phase = "end"
        group = tf_group(strategy, len(strategy.cluster_resolver.cluster_spec().as_dict()["worker"]))
        StoreGroup(TfStore(), group.rank, group.size, prefix="count-probe").barrier("end", 120)
        left = []
        for key in dict.fromkeys(self.keys):  # asked by inserting it (no read that could time out on a busy box)
            try:
                self.raw().set_config_key_value(key, "probe")
            except Exception:  # AlreadyExistsError: it is still there
                left.append(key)
            else:
                self.raw().delete_config_key_value(key)
        with open(out + ".count.json", "w") as f:
            json.dump({"calls": self.calls, "set": self.keys, "left": left}, f)


PROBES: dict = {}  # "count": the Counting proxy of --count


def params(directory: str, epochs: int) -> dict:
    p = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_best_metric": "loss", "ckpt_keep_limit": 3}
    if "--restart-epoch" in sys.argv:  # ckpt_restart_epoch: restore exactly that epoch
        p["ckpt_restart_epoch"] = int(sys.argv[sys.argv.index("--restart-epoch") + 1])
    return p


def dump(path: str, weights: list, opt_vars: list) -> None:
    import numpy as np

    np.savez(
        path,
        **{f"w{i}": np.asarray(w) for i, w in enumerate(weights)},
        **{f"opt{i}": np.asarray(v) for i, v in enumerate(opt_vars)},
    )


def k3_state(model, opt) -> tuple[list, list]:
    return [v.numpy() for v in model.weights], [v.numpy() for v in opt.variables]


def run_fit(keras, strategy, directory: str, epochs: int, out: str, at, saves, state_of) -> None:
    """``model.fit`` with ``candle_ckpt.CandleCheckpointCallback`` (Keras 3 or tf_keras) under ``strategy``."""
    import candle_ckpt as candle

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    p = params(directory, epochs)
    counting = PROBES.get("count")
    if counting is not None:
        counting.phase = "restore"
    found = candle.restart(p, model, verbose=False)
    if counting is not None:
        counting.phase = "fit"
    initial = found["epoch"] if found else 0
    print(f"RESTORED epoch={initial}", flush=True)
    dump(out + ".restored.npz", *state_of(model))

    class Pause(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if at == (self.epoch, batch):
                pause("PAUSED")

    ckpt = candle.CandleCheckpointCallback(p, verbose=False, fs=pausing_fs(saves))
    model.fit(dataset(), epochs=epochs, initial_epoch=initial, verbose=0, callbacks=[ckpt, Pause()])
    dump(out, *state_of(model))
    if counting is not None:
        counting.report(strategy, out)
    print("DONE", flush=True)


def run_mirrored(directory: str, epochs: int, out: str, at, saves) -> None:
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    run_fit(keras, strategy, directory, epochs, out, at, saves, lambda m: k3_state(m, m.optimizer))


def runner_model(strategy):
    """The JobRunner jobs' model, its built Adam and a ``tf.function`` step (loss over the global batch)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        opt = keras.optimizers.Adam(learning_rate=1e-2)
        model.compile(optimizer=opt, loss="mse")  # the runner saves model.optimizer with the model
        opt.build(model.trainable_variables)

    @tf.function
    def train_step(xb, yb):
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum((model(xb, training=True) - yb) ** 2) / GLOBAL_BATCH
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce("SUM", strategy.run(step, args=(xb, yb)), axis=None)

    return model, opt, train_step


def run_k3(directory: str, epochs: int, out: str, at, saves) -> None:
    import numpy as np
    import tensorflow as tf

    import candle_ckpt as candle

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, opt, train_step = runner_model(strategy)
    assert strategy.num_replicas_in_sync == 2

    data = strategy.experimental_distribute_dataset(dataset())
    steps = sum(1 for _ in data)  # per epoch, on this worker
    state = {"batches": 0, "shuffle": np.random.default_rng(3)}  # loop state, saved with every checkpoint
    started: list[int] = []

    def epoch_fn(epoch: int) -> dict:
        if not started:  # the runner has restored (or initialised) by now
            print(f"RESTORED epoch={epoch} batches={state['batches']}", flush=True)
            assert state["batches"] == epoch * steps, state  # the loop state came back too
            dump(out + ".restored.npz", *k3_state(model, opt))
        started.append(epoch)
        total = 0.0
        for batch, (xb, yb) in enumerate(data):
            total += float(train_step(xb, yb))  # all-reduced: the same on every worker
            state["batches"] += 1
            if at == (epoch, batch):
                pause("PAUSED")
        state["shuffle"].random()
        return {"loss": total / steps}

    p = {**params(directory, epochs), "ckpt_async": True}
    runner = candle.JobRunner(
        p,
        epoch_fn=epoch_fn,
        objects={"model": model},
        state=state,
        strategy=strategy,
        verbose=False,
        fs=pausing_fs(saves),
    )
    runner.train()
    assert state["batches"] == epochs * steps, state["batches"]
    dump(out, *k3_state(model, opt))
    print("DONE", flush=True)


def run_tfk(directory: str, epochs: int, out: str, at, saves) -> None:
    import tensorflow as tf

    keras = tf.keras  # tf_keras, because TF_USE_LEGACY_KERAS=1
    assert keras.__name__.startswith("tf_keras"), keras.__name__
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    run_fit(
        keras,
        strategy,
        directory,
        epochs,
        out,
        at,
        saves,
        lambda m: (m.get_weights(), [v.numpy() for v in m.optimizer.variables]),
    )


if __name__ == "__main__":
    kind, directory, epochs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    at, saves = parse_pause(sys.argv[5:])
    if "--corrupt-read" in sys.argv:
        corrupt_read(os.path.join(directory, sys.argv[sys.argv.index("--corrupt-read") + 1]))
    if "--count" in sys.argv:
        PROBES["count"] = Counting()
    {"mirrored": run_mirrored, "k3": run_k3, "tfk": run_tfk}[kind](directory, epochs, out, at, saves)
