"""Async checkpoint stall against the host snapshot, on each installed Keras backend.

::

    python benchmarks/bench_backends.py --state-mib 96 --out backends.json

For each backend (TensorFlow, JAX, PyTorch; those not installed are skipped) a
fresh process builds ``Dense(1024)`` layers trained with Adam (12 MiB of state
per layer: weights and two moments) and measures, as medians:

* **host snapshot**: ``ModelState.snapshot(copy=True)`` alone, once its
  buffers exist (one memcpy of the state, the floor of any async save);
* **async stall**: the time ``CandleCheckpointCallback.on_epoch_end`` blocks
  training with ``ckpt_async`` during a real ``fit``, where each epoch is one
  step plus a sleep (``--compute-s``) that the background write overlaps.

The target is the one of the TensorFlow benchmark: the stall is close to the
snapshot (the write happens off the training thread).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BACKENDS = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def measure(state_mib: int, epochs: int, compute_s: float) -> dict:
    """Run in the child: the medians for the backend in ``$KERAS_BACKEND``."""
    import keras
    import numpy as np

    from candle_ckpt.keras.callback import CandleCheckpointCallback
    from candle_ckpt.keras.state import ModelState

    layers = max(1, round(state_mib / 12))
    model = keras.Sequential([keras.Input((1024,))] + [keras.layers.Dense(1024) for _ in range(layers)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    x = np.zeros((8, 1024), "float32")
    model.fit(x, x, epochs=1, verbose=0)
    state = ModelState(model)
    snaps = []
    for _ in range(epochs):
        start = time.perf_counter()
        snap = state.snapshot(copy=True)
        snaps.append(time.perf_counter() - start)
        snap.busy = False  # as after its write: the next snapshot reuses its buffers
    stalls: list[float] = []

    class Compute(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None) -> None:
            time.sleep(compute_s)  # the background write of the previous epoch overlaps this

    with tempfile.TemporaryDirectory() as d:
        params = {
            "ckpt_directory": d,
            "epochs": epochs,
            "ckpt_async": True,
            "ckpt_keep_limit": 2,
            "ckpt_save_best_metric": "loss",
        }
        cb = CandleCheckpointCallback(params, logger=None, verbose=False)
        save = cb.engine.save

        def timed_save(*args, **kwargs):  # the stall: all the training thread spends on a save
            start = time.perf_counter()
            try:
                return save(*args, **kwargs)
            finally:
                stalls.append(time.perf_counter() - start)

        cb.engine.save = timed_save
        model.fit(x, x, epochs=epochs, verbose=0, callbacks=[Compute(), cb])
        stats = cb.stats()
    mib = sum(a.nbytes for a in snap.arrays()) / 2**20
    waits = stats["writer_wait_s"][1:] or [0.0]
    return {
        "backend": keras.backend.backend(),
        "state_mib": round(mib, 1),
        "snapshot_s": statistics.median(snaps[1:]),
        "async_stall_s": statistics.median(stalls[1:]),
        # Why a stall exceeds the snapshot: the previous write was still running (the disk is slower than
        # state / compute_s), as the slow-writer log line says.
        "writer_wait_s": statistics.median(waits),
        "write_mb_per_s": statistics.median(s["mb_per_s"] for s in stats["saves"][1:] if s["mb_per_s"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mib", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--compute-s", type=float, default=0.5)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.state_mib, args.epochs, args.compute_s)))
        return
    import importlib.util

    rows = []
    for backend, module in BACKENDS.items():
        if importlib.util.find_spec(module) is None:
            print(f"{backend}: not installed, skipped")
            continue
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] + sys.path)
        cmd = [sys.executable, __file__, "--child", "--state-mib", str(args.state_mib), "--epochs", str(args.epochs)]
        out = subprocess.run(cmd + ["--compute-s", str(args.compute_s)], env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{backend} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    head = f"{'backend':<12}{'state MiB':>10}{'snapshot ms':>14}{'async stall ms':>16}{'stall/snapshot':>16}"
    print(head + f"{'writer wait ms':>16}{'write MB/s':>12}")
    for r in rows:
        ratio = r["async_stall_s"] / r["snapshot_s"]
        print(
            f"{r['backend']:<12}{r['state_mib']:>10}{r['snapshot_s'] * 1e3:>14.1f}"
            f"{r['async_stall_s'] * 1e3:>16.1f}{ratio:>16.2f}"
            f"{r['writer_wait_s'] * 1e3:>16.1f}{r['write_mb_per_s']:>12.0f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
