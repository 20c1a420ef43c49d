"""A worker of the multi-worker preemption tests, run as a real process (one per TF_CONFIG task).

Usage::

    python mw_preempt_job.py KIND DIR EPOCHS OUT.npz [--wait-at E:B] [--exit-code N]

KIND:
    ``k3``   Keras 3 custom loop (``strategy.run`` of a GradientTape step) under
             MultiWorkerMirroredStrategy through ``candle_ckpt.JobRunner``, which
             is told of every step with ``runner.step_end()``; ``ckpt_async``.
    ``mirrored-fit``  Keras 3 ``model.fit`` under MirroredStrategy on 2 logical CPUs of one process (no
             TF_CONFIG) with the Keras 3 callback, which continues a resumed epoch after its saved step.
    ``tfk``  tf_keras ``model.fit`` under MultiWorkerMirroredStrategy with
             ``candle_ckpt.CandleCheckpointCallback`` (run with ``TF_USE_LEGACY_KERAS=1``).

The job restores (the chief's choice), prints ``RESTORED epoch=E step=S``,
trains to EPOCHS and saves its final weights and optimizer variables to OUT,
printing ``DONE``. A preemption that stops training prints ``PREEMPTED E:S``
(S steps done in epoch E, 0-based) instead; one that exits prints it first.

``--wait-at E:B`` prints ``WAITING`` after batch B of epoch E and blocks until
a signal has reached this process (its handler has run), so that the test
knows the signal lands between batch B and B+1: every worker must then save
at step B+2 of epoch E. ``--exit-code N`` sets ``ckpt_preempt_exit_code``.
"""

from __future__ import annotations

import os
import select
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from dist_job import FEATURES, GLOBAL_BATCH, N, dataset, dump, runner_model  # noqa: E402  (this folder is sys.path[0])


def wait_for_signal() -> None:
    """Print WAITING, then block until a signal reaches this process (or 120 s pass)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w)  # written to when a signal with a Python handler arrives
    try:
        print("WAITING", flush=True)
        ready, _, _ = select.select([r], [], [], 120)
        assert ready, "no signal arrived"
    finally:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)


def params(directory: str, epochs: int, exit_code: int | None) -> dict:
    p = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_best_metric": "loss", "ckpt_async": True}
    if exit_code is not None:
        p["ckpt_preempt_exit_code"] = exit_code
    return p


def mirrored_strategy():
    """MirroredStrategy over 2 logical CPUs of this one process."""
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def run_k3(directory: str, epochs: int, out: str, wait_at, exit_code) -> None:
    import numpy as np
    import tensorflow as tf

    import candle_ckpt as candle

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 2
    model, opt, train_step = runner_model(strategy)

    # The epoch's loss sum is loop state: a resumed epoch ends with the same logs as an uninterrupted one.
    state = {"batches": 0, "total": 0.0, "shuffle": np.random.default_rng(3)}
    started: list[int] = []

    def state_of():
        return [v.numpy() for v in model.weights], [v.numpy() for v in opt.variables]

    data = strategy.experimental_distribute_dataset(dataset())
    steps = sum(1 for _ in data)  # per epoch, on this worker (MWMS rebatches each global batch)

    def epoch_fn(epoch: int) -> dict:
        start = runner.step  # batches of this epoch already done (a resumed mid-epoch checkpoint)
        if not started:
            print(f"RESTORED epoch={epoch} step={start} batches={state['batches']}", flush=True)
            assert state["batches"] == epoch * steps + start, state
            dump(out + ".restored.npz", *state_of())
        started.append(epoch)
        if start == 0:
            state["total"] = 0.0
        batches = iter(data)
        for _ in range(start):  # the batches done before the preemption save
            next(batches)
        for batch, (xb, yb) in enumerate(batches, start=start):
            state["total"] += float(train_step(xb, yb))  # all-reduced: the same on every worker
            state["batches"] += 1
            if runner.step_end({"loss": state["total"] / (batch + 1)}):
                return {}
            if wait_at == (epoch, batch):
                wait_for_signal()
        state["shuffle"].random()
        return {"loss": state["total"] / steps}

    runner = candle.JobRunner(
        params(directory, epochs, exit_code), epoch_fn=epoch_fn, objects={"model": model}, state=state,
        strategy=strategy, verbose=False,
    )  # fmt: skip
    try:
        runner.train()
    finally:
        if runner.preempted is not None:
            print("PREEMPTED {}:{}".format(*runner.preempted), flush=True)
    if runner.preempted is None:
        assert state["batches"] == epochs * steps, state["batches"]
        dump(out, *state_of())
        print("DONE", flush=True)


def run_tfk(directory: str, epochs: int, out: str, wait_at, exit_code) -> None:
    import tensorflow as tf

    import candle_ckpt as candle

    keras = tf.keras  # tf_keras, because TF_USE_LEGACY_KERAS=1
    assert keras.__name__.startswith("tf_keras"), keras.__name__
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")

    def state_of():
        return model.get_weights(), [v.numpy() for v in model.optimizer.variables]

    p = params(directory, epochs, exit_code)
    found = candle.restart(p, model, verbose=False)
    epoch, step = (found["epoch"], found.get("step") or 0) if found else (0, 0)
    print(f"RESTORED epoch={epoch} step={step}", flush=True)
    dump(out + ".restored.npz", *state_of())

    class Wait(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if wait_at == (self.epoch, batch):
                wait_for_signal()

    ckpt = candle.CandleCheckpointCallback(p, verbose=False)
    try:
        if step:  # the rest of the interrupted epoch, then the other epochs
            # With sharding off each worker's step reads GLOBAL_BATCH / workers samples from the start
            # of the data, and tf_keras runs (cardinality) steps: the rest starts at sample step * 8.
            rest = dataset(step * GLOBAL_BATCH // 2, (N // GLOBAL_BATCH - step) * GLOBAL_BATCH)
            model.fit(rest, epochs=epoch + 1, initial_epoch=epoch, verbose=0, callbacks=[ckpt])
            epoch += 1
        model.fit(dataset(), epochs=epochs, initial_epoch=epoch, verbose=0, callbacks=[ckpt, Wait()])
    finally:
        saved = ckpt.preempted
        if saved is not None:
            print("PREEMPTED {}:{}".format(*saved), flush=True)
    if saved is None:
        dump(out, *state_of())
        print("DONE", flush=True)


def run_mirrored_fit(directory: str, epochs: int, out: str, wait_at, exit_code) -> None:
    """Keras 3 ``model.fit`` under MirroredStrategy on 2 logical CPUs, with the Keras 3 callback."""
    strategy = mirrored_strategy()
    import keras

    import candle_ckpt as candle

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")

    def state_of():
        return [v.numpy() for v in model.weights], [v.numpy() for v in model.optimizer.variables]

    p = params(directory, epochs, exit_code)
    found = candle.restart(p, model, verbose=False)
    epoch, step = (found["epoch"], found.get("step") or 0) if found else (0, 0)
    print(f"RESTORED epoch={epoch} step={step}", flush=True)
    dump(out + ".restored.npz", *state_of())

    class Wait(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if wait_at == (self.epoch, batch):
                wait_for_signal()

    ckpt = candle.CandleCheckpointCallback(p, verbose=False)
    try:  # the callback continues a resumed epoch after its saved step
        model.fit(dataset(), epochs=epochs, initial_epoch=epoch, verbose=0, callbacks=[ckpt, Wait()])
    finally:
        saved = (ckpt.stats().get("preempt") or {}).get("step")
        if saved is not None:
            print("PREEMPTED {}:{}".format(ckpt.stats()["preempt"]["epoch"], saved), flush=True)
    if saved is None:
        dump(out, *state_of())
        print("DONE", flush=True)


if __name__ == "__main__":
    kind, directory, epochs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rest = sys.argv[5:]
    wait_at = tuple(int(v) for v in rest[rest.index("--wait-at") + 1].split(":")) if "--wait-at" in rest else None
    code = int(rest[rest.index("--exit-code") + 1]) if "--exit-code" in rest else None
    {"k3": run_k3, "tfk": run_tfk, "mirrored-fit": run_mirrored_fit}[kind](directory, epochs, out, wait_at, code)
