"""Side by side in a 2-process JAX job: candle_ckpt (sync, async) against Keras's ``OrbaxCheckpoint``.

Usage::

    python3 benchmarks/bench_jax_multiprocess.py [--mib 256] [--epochs 5] [--out results/jax-mp.json]

Each contender runs the same job: 2 processes x 2 CPU devices (gloo), ModelParallel with the big
kernels sharded over all 4 devices, Adam (so the state is about 3x the weights), ``--mib`` MiB of
state in all. Per contender it reports, from process 0:

- ``stall_s``: the mean extra wall time of an epoch end over the run without checkpointing (the
  first epoch, which compiles, is left out);
- ``bytes_per_ckpt`` and ``bytes_ratio``: what one checkpoint holds on disk, against the state;
- ``restart_s``: the time to restore the last checkpoint into a fresh model (candle_ckpt:
  ``restart()``; Orbax: ``model.load_weights`` of its directory, or the error Keras raised).

The machine's load average is recorded with the result: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

CONTENDERS = ("none", "candle_sync", "candle_async", "orbax")
STEPS, BATCH, FEATURES = 2, 8, 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def _model(mib: int):
    """A model whose weights are a third of ``mib`` MiB (Adam adds two slots of the same size)."""
    import keras

    weights = mib * 2**20 // 3 // 4  # float32 values
    hidden = max(64, (weights // (2 * FEATURES)) // 64 * 64)
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(hidden, activation="relu", name="big_a")(inputs)
    out = keras.layers.Dense(FEATURES, name="big_b")(h)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


def _distribution():
    import keras

    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout["big_a/kernel"] = (None, "model")
    layout["big_b/kernel"] = ("model", None)
    return keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch")


def child(rank: int, port: int, contender: str, directory: str, mib: int, epochs: int, out: str) -> None:
    """One process of one contender's job; process 0 writes its timings to ``out``."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", 2, rank)
    import keras
    import numpy as np

    import candle_ckpt

    keras.utils.set_random_seed(1)
    dist = _distribution()
    dist.auto_shard_dataset = False  # the batch axis has one device: every process feeds the same batches
    keras.distribution.set_distribution(dist)
    model = _model(mib)
    x = np.random.default_rng(0).standard_normal((STEPS * BATCH, FEATURES)).astype("float32")
    times: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            times.append(time.perf_counter())

    params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_keep_limit": 2}
    callbacks: list = [Clock()]
    if contender.startswith("candle"):
        params["ckpt_async"] = contender == "candle_async"
        callbacks.append(candle_ckpt.CandleCheckpointCallback(params, verbose=False))
    elif contender == "orbax":
        callbacks.append(keras.callbacks.OrbaxCheckpoint(directory, save_freq="epoch", max_to_keep=2))
    model.fit(x, x, batch_size=BATCH, epochs=epochs, validation_data=(x, x), verbose=0, callbacks=callbacks)
    end = time.perf_counter()
    state = sum(int(np.prod(v.shape)) * 4 for v in list(model.weights) + list(model.optimizer.variables))
    restart_s = None
    fresh = _model(mib)
    start = time.perf_counter()
    if contender.startswith("candle"):
        candle_ckpt.restart(params, fresh, verbose=False)
        restart_s = time.perf_counter() - start
    elif contender == "orbax":
        try:
            fresh.load_weights(directory)  # Keras reads its Orbax directory's newest step
            restart_s = time.perf_counter() - start
        except Exception as err:  # Keras's own restore of its Orbax directory; recorded, not hidden
            restart_s = f"error: {type(err).__name__}: {err}"[:300]
    if rank == 0:
        epochs_s = [b - a for a, b in zip(times, times[1:] + [end], strict=True)]
        kept = 2 if contender != "none" else 0
        with open(out, "w") as f:
            json.dump({"epochs_s": epochs_s, "state_bytes": state, "kept": kept, "restart_s": restart_s}, f)


def run(contender: str, mib: int, epochs: int, timeout_s: float) -> dict:
    """Both processes of one contender's job; its figures."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{contender}-") as tmp:
        directory, out, port = os.path.join(tmp, "ck"), os.path.join(tmp, "out.json"), _free_port()
        env = dict(os.environ, KERAS_BACKEND="jax", JAX_NUM_CPU_DEVICES="2", TF_CPP_MIN_LOG_LEVEL="3")
        args = ["--mib", str(mib), "--epochs", str(epochs), "--child"]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *args, str(rank), str(port), contender, directory, out],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in (0, 1)
        ]
        try:
            errs = [p.communicate(timeout=timeout_s)[1] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{contender} failed: {errs[0][-2000:]} {errs[1][-2000:]}")
        with open(out) as f:
            result = json.load(f)
        result["bytes_per_ckpt"] = _du(directory) / result["kept"] if result["kept"] else 0
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--child", nargs=5, default=None)
    args = parser.parse_args()
    if args.child:
        rank, port, contender, directory, out = args.child
        child(int(rank), int(port), contender, directory, args.mib, args.epochs, out)
        return
    load_before = os.getloadavg()
    results = {c: run(c, args.mib, args.epochs, args.timeout) for c in CONTENDERS}
    base = results["none"]["epochs_s"][1:]
    report = {"mib": args.mib, "epochs": args.epochs, "processes": 2, "devices_per_process": 2}
    report["load_average_before"] = load_before
    report["load_average_after"] = os.getloadavg()
    for r in results.values():
        ends = r["epochs_s"][1:]
        r["stall_s"] = (sum(ends) / len(ends)) - (sum(base) / len(base))
        r["bytes_ratio"] = r["bytes_per_ckpt"] / r["state_bytes"] if r["bytes_per_ckpt"] else None
    for name in ("candle_sync", "candle_async"):
        orbax = results["orbax"]["stall_s"]
        results[name]["stall_vs_orbax"] = results[name]["stall_s"] / orbax if orbax > 0 else None
    report["contenders"] = results
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
