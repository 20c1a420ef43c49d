"""One process of a multi-process JAX job with a custom training loop under ``JobRunner``, run as a real process.

Usage::

    python jax_runner_job.py dp DIR EPOCHS OUT.npz PORT RANK NPROC [--pause-at=E:S[:SEC]] [--heartbeat=SEC]
        [--hang-timeout=SEC] [--stuck-reads]

The loop a user writes after Keras's "training loop from scratch in JAX" guide, on every process:
``DataParallel`` over every device (2 CPU devices per process, gloo), a jitted step over
``model.stateless_call`` and ``optimizer.stateless_apply`` whose results are assigned back to the
variables after each step, each process feeding its own half of every global batch
(``jax.make_array_from_process_local_data``) in an order drawn from its own
``numpy.random.Generator``. The loop state (``state=``): that generator, the position in the
epoch, a running loss sum, and a ``keras.Variable`` counting samples. ``runner.step_end()``
after every step; a resumed epoch skips the steps already done.

Prints ``RESUMED epoch=N step=S`` (``N=-1`` on a fresh start), and saves every variable and the
loop state to OUT. ``--pause-at=E:S[:SEC]`` prints ``PAUSED`` after step S (1-based) of epoch E
(0-based), once the write in flight is done, and sleeps SEC seconds (600: the test kills or signals it).
``--hang-timeout``: ``ckpt_hang_timeout``; ``--stuck-reads``: from the runner's restore on, every read under
``ckpts/epochs`` and ``ckpts/steps`` blocks for good (printing ``blocking``).
"""

from __future__ import annotations

import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from jax_mp_job import flag  # noqa: E402

N, FEATURES, HIDDEN, BATCH = 64, 8, 16, 8  # BATCH: the global batch (each process feeds half)


def main() -> None:
    _, directory, epochs, out, port, rank, nproc = sys.argv[1:8]
    rank, nproc, epochs = int(rank), int(nproc), int(epochs)
    flags = sys.argv[8:]
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    heartbeat = flag(flags, "heartbeat")
    extra = {} if heartbeat is None else {"heartbeat_timeout_seconds": int(heartbeat)}
    jax.distributed.initialize(f"localhost:{port}", nproc, rank, **extra)
    import keras
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from candle_ckpt import JobRunner

    keras.utils.set_random_seed(1)
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    h = keras.layers.Dropout(0.2, seed=3)(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.MeanSquaredError()

    data_rng = np.random.default_rng(0)
    x = data_rng.standard_normal((N, FEATURES)).astype("float32")
    y = (x @ data_rng.standard_normal((FEATURES, 1))).astype("float32")
    x, y = x[rank::nproc], y[rank::nproc]  # this process's half of the data
    local = BATCH // nproc
    steps = len(x) // local
    batches = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))

    def compute_loss(trainable, non_trainable, xb, yb):
        pred, non_trainable = model.stateless_call(trainable, non_trainable, xb, training=True)
        return loss_fn(yb, pred), non_trainable

    @jax.jit
    def train_step(trainable, non_trainable, opt_vars, xb, yb):
        (loss, non_trainable), grads = jax.value_and_grad(compute_loss, has_aux=True)(trainable, non_trainable, xb, yb)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return loss, trainable, non_trainable, opt_vars

    state = {
        "order_rng": np.random.default_rng(100 + rank),  # each process draws its own order
        "order": np.arange(steps * local),
        "loss_sum": 0.0,
        "seen": keras.Variable(0.0, name="seen"),
    }
    pause = flag(flags, "pause-at")
    pause = tuple(int(s) for s in pause.split(":")) if pause else None

    def epoch_fn(epoch: int) -> dict:
        start = runner.step  # > 0 only in an epoch resumed from a step checkpoint
        if start == 0:
            state["order"] = state["order_rng"].permutation(len(x))[: steps * local]
            state["loss_sum"] = 0.0
        for step in range(start, steps):
            idx = state["order"][step * local : (step + 1) * local]
            xb = jax.make_array_from_process_local_data(batches, x[idx])
            yb = jax.make_array_from_process_local_data(batches, y[idx])
            values = [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]
            loss, trainable, non_trainable, opt_vars = train_step(
                *values, [v.value for v in optimizer.variables], xb, yb
            )
            for variables, new in (
                (model.trainable_variables, trainable),
                (model.non_trainable_variables, non_trainable),
                (optimizer.variables, opt_vars),
            ):
                for v, value in zip(variables, new, strict=True):
                    v.assign(value)
            state["loss_sum"] += float(loss)  # the global batch's loss: the same on every process
            state["seen"].assign(state["seen"] + BATCH)
            if pause is not None and pause[:2] == (epoch, step + 1):
                runner.engine.writer.wait(120)  # the last epoch's commit is published first, however loaded the box
                print("PAUSED", flush=True)
                time.sleep(pause[2] if len(pause) > 2 else 600)
            if runner.step_end({"loss": state["loss_sum"] / (step + 1)}):
                return {}
        return {"loss": state["loss_sum"] / steps}

    params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_keep_limit": 3, "ckpt_save_best_metric": "loss"}
    hang = flag(flags, "hang-timeout")
    if hang is not None:
        params["ckpt_hang_timeout"] = hang
    runner = JobRunner(params, epoch_fn=epoch_fn, objects={"model": model, "opt": optimizer}, state=state, logger=None)
    if "--stuck-reads" in flags:  # every read of a checkpoint blocks for good (its disk stopped answering)
        from hang_job import stuck_checkpoint_reads

        stuck_checkpoint_reads(directory)
    runner.train()
    print(f"RESUMED epoch={-1 if runner.resumed_from is None else runner.resumed_from} "
          f"step={runner.resumed_step or 0}", flush=True)  # fmt: skip
    arrays = {f"{i:03d}:{v.path}": np.asarray(v.value) for i, v in enumerate(model.variables + optimizer.variables)}
    arrays["order_rng"] = state["order_rng"].standard_normal(3)
    arrays["order"], arrays["loss_sum"] = state["order"], np.asarray(state["loss_sum"])
    arrays["seen"] = np.asarray(state["seen"].value)
    np.savez(out, **arrays)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
