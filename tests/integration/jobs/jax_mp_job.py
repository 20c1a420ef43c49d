"""One process of a multi-process JAX job (keras.distribution), run as a real process.

Usage::

    srun -n N python jax_mp_job.py DIST DIR EPOCHS OUT{rank}.npz slurm - - [flags]   (under Slurm)

    python jax_mp_job.py DIST DIR EPOCHS OUT.npz PORT RANK NPROC [--async | --sync] [--pause-at=E:B[:S]]
        [--second-model] [--pause-epoch-end=E] [--heartbeat=S] [--rows=R] [--mesh=B,M] [--keys-out=PATH]
        [--hang-timeout=S]

DIST: ``dp`` (DataParallel over every device), ``mp`` (ModelParallel, a 1 x D mesh whose
``model`` axis shards the first Dense kernel over every process), ``none`` (no distribution:
one process). Each process has 2 CPU devices unless ``JAX_NUM_CPU_DEVICES`` says otherwise, gloo collectives.

Every process runs the same code: ``restart(params, model)`` before ``fit``, the callback in
``fit`` (``shuffle=True``, validation data). It prints ``RESTORED epoch=N``, saves the restored
weights to ``OUT.restored.npz`` and, after fit, the final weights and optimizer variables to OUT.
``--second-model`` builds a throwaway model first, so this one's variable paths differ from the saved ones.
``--pause-at=E:B[:S]`` prints ``PAUSED`` after batch B of epoch E, once the write in flight is done, and sleeps S
seconds (600: the test kills it).
``--pause-rank=R``: only rank R pauses (``--pause-at``); ``--pause-once``: only while ``DIR/paused-once`` does not
exist yet (the first run makes it: a requeued run does not pause); ``--pauser-hang-timeout=S``: the pausing
process's ``ckpt_hang_timeout`` (over ``--hang-timeout``).
``--pause-before-restart=S`` prints ``PAUSED`` just before ``restart()`` and sleeps S seconds there.
``--stuck-reads``: from ``restart()`` on, every read under ``ckpts/epochs`` and ``ckpts/steps`` blocks for good
(printing ``blocking``), as on a disk that stopped answering.
``--pause-epoch-end=E`` prints ``PAUSED`` in ``on_epoch_end`` of epoch E, before that epoch's checkpoint, and sleeps.
``--heartbeat=S``: ``jax.distributed.initialize(heartbeat_timeout_seconds=S)`` (how soon a dead peer is noticed).
``--hidden=H``: H units in the first Dense layer (16 by default; larger values make the state big enough to be
cut in slices). ``--verbose``: ``restart()`` and the callback log to the console. ``--print-stats``: after fit,
print ``STATS {json}`` (the callback's ``stats()``: its saves and its restore) and log the closing report
(``report_final()``).
``--rows=R``: R rows of data in all (64 unless told; under ``dp`` each process feeds R / NPROC of them).
``--mesh=B,M``: ``mp`` on a B x M mesh (``batch`` x ``model``, B * M devices in all) instead of 1 x D; the
processes of one mesh row feed the same rows, each row its own share.
``--mtbf=S``: ``ckpt_mtbf=S``. ``--step-sleep=S``: every step takes S seconds more (a real model's step time).
``--intervals=K`` (with ``--step-sleep``): once the interval of ``ckpt_save_steps=auto`` is known, every step takes
at least its seconds x K / steps of an epoch, so that K intervals fit in an epoch however long a save takes here.
``--node-local``: this process's ``ckpt_directory`` is ``DIR/node<RANK>`` (each its own, as on node-local disks).
``--persistent=URL``: ``ckpt_persistent_url``; ``--drain=POLICY``: ``ckpt_drain``.
``CANDLE_WALK_OUT=PATH`` (environment): the modules of candle_ckpt this process enters from ``PAUSED`` on are
written to ``PATH.p<RANK>`` (:mod:`module_walk`: docs/architecture.rst's walk of a SIGTERM).
``--keys-out=PATH``: after fit, every process meets (a device barrier), then rank 0 writes to PATH, as JSON,
the keys under ``candle_ckpt/`` still held by the coordination service (what a long job accumulates).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # another only where a test asks (JaxJob's env)
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

N, FEATURES, HIDDEN, BATCH = 64, 8, 16, 8


def make_data(rows: int = N):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, FEATURES)).astype("float32")
    y = (x @ rng.standard_normal((FEATURES, 1)) + 0.1 * rng.standard_normal((rows, 1))).astype("float32")
    return x, y


def distribution(kind: str, shape: tuple[int, int] | None = None):
    """The job's keras.distribution (None for ``none``); ``shape``: the ``mp`` mesh (1 x D unless given)."""
    import keras

    if kind == "none":
        return None
    devices = keras.distribution.list_devices()
    if kind == "dp":
        return keras.distribution.DataParallel(devices=devices)
    mesh = keras.distribution.DeviceMesh(shape or (1, len(devices)), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout["dense_a/kernel"] = (None, "model")
    layout["dense_a/bias"] = ("model",)
    return keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch")


def build_model(hidden: int = HIDDEN):
    import keras

    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(hidden, activation="relu", name="dense_a")(inputs)
    h = keras.layers.Dropout(0.2, seed=3)(h)
    out = keras.layers.Dense(1, name="dense_b")(h)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def dump(model, path: str) -> None:
    """Every weight and optimizer variable, gathered to this process, into ``path``."""
    import numpy as np
    from jax.experimental import multihost_utils

    arrays = {}
    for i, v in enumerate(list(model.weights) + list(model.optimizer.variables)):
        value = v.value
        if hasattr(value, "is_fully_addressable") and not value.is_fully_addressable:
            value = multihost_utils.process_allgather(value, tiled=True)
        arrays[f"{i:03d}:{v.path}"] = np.asarray(value)
    np.savez(path, **arrays)


def Pause(epoch: int, batch: int, seconds: int = 600, every: float = 0.0, ckpt=None, intervals: int = 0):
    """A callback that prints PAUSED after ``batch`` of ``epoch`` (0-based) and sleeps (to be killed or signalled);
    ``every``: it also sleeps that long after every batch (a real model's step time); ``intervals`` (with ``ckpt``,
    the checkpoint callback): at least the auto interval's seconds x ``intervals`` / steps of an epoch. With ``ckpt``,
    the pause (and a walk, CANDLE_WALK_OUT) starts once ``ckpt``'s background write in flight is done (bounded), so a
    kill at PAUSED lands after the last epoch's checkpoint is committed, however loaded the machine."""
    import keras

    class _Pause(keras.callbacks.Callback):
        def on_epoch_begin(self, e, logs=None):
            self.epoch = e

        def on_train_batch_end(self, b, logs=None):
            if self.epoch == epoch and b == batch:
                # Under load the last epoch's background commit may still be under way two steps later (a CI run
                # killed process 0 before epoch 1 was published, and the rerun found nothing): wait for it, bounded.
                # The walk then counts the flow from this step on, not the tail of that commit.
                if ckpt is not None:
                    ckpt.engine.writer.wait(120)
                if WALK is not None:
                    WALK.start()
            interval_s = (ckpt.stats()["steps"].get("seconds") or 0.0) if intervals else 0.0
            time.sleep(max(every, interval_s * intervals / self.params["steps"]))
            if self.epoch == epoch and b == batch:
                print("PAUSED", flush=True)
                time.sleep(seconds)

    return _Pause()


def PauseAtEpochEnd(epoch: int, seconds: int = 600):
    """A callback that prints PAUSED in ``on_epoch_end`` of ``epoch`` (before its checkpoint) and sleeps."""
    import keras

    class _Pause(keras.callbacks.Callback):
        def on_epoch_end(self, e, logs=None):
            if e == epoch:
                print("PAUSED", flush=True)
                time.sleep(seconds)

    return _Pause()


def flag(flags: list[str], name: str) -> str | None:
    """The value of ``--name=VALUE`` among ``flags`` (None if absent)."""
    return next((f.split("=", 1)[1] for f in flags if f.startswith(f"--{name}=")), None)


def write_keys(path: str) -> None:
    """Every process meets; then rank 0 writes the keys under ``candle_ckpt/`` the coordination service holds."""
    import json

    import jax
    from jax.experimental import multihost_utils

    from candle_ckpt.distributed.jax_group import coordination_client

    multihost_utils.sync_global_devices("keys-out")  # every process is past fit: no meeting is under way
    if jax.process_index() == 0:
        client = coordination_client()
        keys = sorted(k for k, _ in client.key_value_dir_get("candle_ckpt/")) if client is not None else []
        with open(path, "w") as f:
            json.dump({"processes": jax.process_count(), "keys": keys}, f)
    multihost_utils.sync_global_devices("keys-read")  # nobody shuts the service down before rank 0 has read


#: The walk from PAUSED on (CANDLE_WALK_OUT), installed before anything starts a thread.
WALK = None


def main() -> None:
    global WALK
    dist, directory, epochs, out, port, rank, nproc = sys.argv[1:8]
    flags = sys.argv[8:]
    if os.environ.get("CANDLE_WALK_OUT"):
        from module_walk import Walk, import_all

        import_all()
        WALK = Walk(f"{os.environ['CANDLE_WALK_OUT']}.p{rank}").install()
    import jax

    if port == "slurm":  # one task of `srun -n N`: jax.distributed reads Slurm's environment by itself
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize()
        rank, nproc = jax.process_index(), jax.process_count()
        out = out.replace("{rank}", str(rank))
    rank, nproc = int(rank), int(nproc)
    if nproc > 1 and port != "slurm":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        beat = next((int(f.split("=")[1]) for f in flags if f.startswith("--heartbeat=")), None)
        extra = {} if beat is None else {"heartbeat_timeout_seconds": beat}
        jax.distributed.initialize(f"localhost:{port}", nproc, rank, **extra)
    import keras

    import candle_ckpt

    keras.utils.set_random_seed(1)
    mesh = flag(flags, "mesh")
    d = distribution(dist, tuple(int(s) for s in mesh.split(",")) if mesh else None)
    if d is not None:
        d.auto_shard_dataset = False  # each process feeds its own part of the data (below)
        keras.distribution.set_distribution(d)
    if "--second-model" in flags:  # a model built before: Keras numbers this one's names (adam_1, ...)
        build_model()
    hidden = next((int(f.split("=")[1]) for f in flags if f.startswith("--hidden=")), HIDDEN)
    model = build_model(hidden)
    verbose = "--verbose" in flags
    if "--node-local" in flags:
        directory = os.path.join(directory, f"node{rank}")
    tiers = {key: flag(flags, name) for name, key in (("persistent", "ckpt_persistent_url"), ("drain", "ckpt_drain"))}
    params = {
        **{key: value for key, value in tiers.items() if value is not None},
        "ckpt_directory": directory,
        "epochs": int(epochs),
        "ckpt_save_interval": 1,
        "ckpt_keep_limit": 3,
    }
    pause = flag(flags, "pause-at")
    if flag(flags, "pause-rank") not in (None, str(rank)):
        pause = None
    once = os.path.join(directory, "paused-once")
    if pause is not None and "--pause-once" in flags:  # the first run pauses, a requeued one does not
        pause = None if os.path.exists(once) else pause
        os.makedirs(directory, exist_ok=True)
        open(once, "w").close()
    if flag(flags, "hang-timeout"):  # ckpt_hang_timeout (the default: auto)
        params["ckpt_hang_timeout"] = flag(flags, "hang-timeout")
    if pause is not None and flag(flags, "pauser-hang-timeout"):
        params["ckpt_hang_timeout"] = flag(flags, "pauser-hang-timeout")
    if "--async" in flags or "--sync" in flags:  # else the default: auto (asynchronous)
        params["ckpt_async"] = "--async" in flags
    if flag(flags, "mtbf"):
        params["ckpt_mtbf"] = float(flag(flags, "mtbf"))
    if flag(flags, "pause-before-restart"):  # a process stuck before its restore (an import on a hung mount)
        print("PAUSED", flush=True)
        time.sleep(float(flag(flags, "pause-before-restart")))
    if "--stuck-reads" in flags:  # every read of a checkpoint blocks for good (its disk stopped answering)
        from hang_job import stuck_checkpoint_reads

        stuck_checkpoint_reads(directory)
    found = candle_ckpt.restart(params, model, verbose=verbose)
    epoch = found["epoch"] if found else 0
    print(f"RESTORED epoch={epoch}", flush=True)
    dump(model, out + ".restored.npz")
    callbacks = [candle_ckpt.CandleCheckpointCallback(params, verbose=verbose)]
    if pause is not None:
        callbacks.append(Pause(*(int(s) for s in pause.split(":")), ckpt=callbacks[0]))
    at_end = next((f.split("=")[1] for f in flags if f.startswith("--pause-epoch-end=")), None)
    if at_end is not None:
        callbacks.append(PauseAtEpochEnd(int(at_end)))
    if flag(flags, "step-sleep"):
        intervals = int(flag(flags, "intervals") or 0)
        callbacks.append(Pause(-1, -1, 0, float(flag(flags, "step-sleep")), callbacks[0], intervals))
    x, y = make_data(int(flag(flags, "rows") or N))
    if dist == "dp":  # the batch is split over the processes: each feeds its own part of every global batch
        x, y = x[rank::nproc], y[rank::nproc]
    elif mesh:  # one batch row per mesh row: the processes of a row (rank // M, one device each) feed the same
        rows, cols = (int(s) for s in mesh.split(","))
        x, y = x[rank // cols :: rows], y[rank // cols :: rows]
    # ModelParallel on 1 x D: the 'batch' axis has one device, so every process feeds the same whole batches
    model.fit(
        x, y, batch_size=BATCH, epochs=int(epochs), initial_epoch=epoch, validation_data=(x[:16], y[:16]),
        callbacks=callbacks, verbose=0,
    )  # fmt: skip
    dump(model, out)
    if "--print-stats" in flags:
        import json

        print("STATS " + json.dumps(callbacks[0].stats(), default=str), flush=True)
        callbacks[0].report_final()
    keys_out = flag(flags, "keys-out")
    if keys_out:
        write_keys(keys_out)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
