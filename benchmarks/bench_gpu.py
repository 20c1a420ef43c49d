"""On an accelerator: candle_ckpt's host snapshot against a pinned device-to-host copy, and the stall.

Run where JAX sees a GPU (it runs on CPU too, as a dry run)::

    KERAS_BACKEND=jax python benchmarks/bench_gpu.py --state-mib 256 --out results/gpu.json

What it measures, on one model of about ``--state-mib`` of state (``Dense`` layers trained with
Adam, as ``bench_checkpoint.py``), every figure a median:

* ``snapshot_async_s``: ``ModelState.snapshot(copy=True)``, what the async save takes on the
  training thread (every variable to host memory the snapshot owns; buffers reused after the
  first save);
* ``snapshot_sync_s``: ``ModelState.snapshot(copy=False)`` (host views of every variable; on an
  accelerator a device-to-host copy each);
* ``pinned_d2h_s``: the floor: one ``jax.device_put`` of the same arrays to ``pinned_host``
  memory, all transfers in flight at once;
* ``per_array_asarray_s``: ``np.asarray`` of each array in turn (one blocking transfer after another,
  what a snapshot did before it started every transfer at once);
* ``device_get_s``: ``jax.device_get`` of the same arrays (batched, pageable host memory);
* ``pinned_then_numpy_s``: the pinned copy and then ``np.asarray`` of each result (what the
  writer's thread adds to the snapshot);
* ``snapshot_exact``: an async snapshot still holds its moment's values, bit for bit, after three
  more train steps (the order of the copy and the steps' buffer donation);
* ``stall_s`` per contender: the training thread's wait at an epoch end, in a real ``fit``
  with a simulated compute phase (``bench_lib.run_fit``): candle_ckpt sync and async at their
  defaults, and ``OrbaxCheckpoint`` at its defaults where orbax-checkpoint is installed.

Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from bench_lib import build_model, median, run_fit  # noqa: E402

from candle_ckpt import CandleCheckpointCallback  # noqa: E402
from candle_ckpt.keras.state import ModelState  # noqa: E402


def _arrays(model) -> list:
    return [v.value for v in model.variables] + [v.value for v in model.optimizer.variables]


def timed(fn, reps: int, refresh) -> float:
    """Median time of ``fn(arrays)`` on fresh arrays: ``refresh()`` (a train step, untimed) runs before each
    call, so that no call finds a host copy JAX kept from the one before (as in training)."""
    times = []
    for rep in range(reps + 1):  # the first is a warm-up: first transfers, buffers, compilation
        arrays = refresh()
        start = time.perf_counter()
        fn(arrays)
        if rep:
            times.append(time.perf_counter() - start)
    return median(times)


def floors(model, x, reps: int) -> dict:
    """The snapshot paths against device-to-host copies of the same arrays."""
    state = ModelState(model)

    def refresh() -> list:
        model.train_on_batch(x, x)
        arrays = _arrays(model)
        jax.block_until_ready(arrays)
        return arrays

    arrays = refresh()
    out = {"state_bytes": sum(int(a.nbytes) for a in arrays), "arrays": len(arrays)}

    def snap_async(_):
        snap = state.snapshot(copy=True)
        snap.busy = False  # written at once in a real save; here the buffers go back to be reused

    out["snapshot_async_s"] = timed(snap_async, reps, refresh)
    out["snapshot_sync_s"] = timed(lambda _: state.snapshot(copy=False), reps, refresh)
    out["per_array_asarray_s"] = timed(lambda arrays: [np.asarray(a) for a in arrays], reps, refresh)
    out["device_get_s"] = timed(jax.device_get, reps, refresh)
    try:
        shardings = [a.sharding.with_memory_kind("pinned_host") for a in arrays]
        out["pinned_d2h_s"] = timed(lambda a: jax.block_until_ready(jax.device_put(a, shardings)), reps, refresh)
        out["pinned_then_numpy_s"] = timed(
            lambda a: [np.asarray(h) for h in jax.device_put(a, shardings)], reps, refresh
        )
    except Exception as err:  # a platform without a pinned_host memory space
        out["pinned_d2h_s"] = None
        out["pinned_d2h_error"] = f"{type(err).__name__}: {err}"[:200]
    out["snapshot_exact"] = snapshot_is_exact(model, x, state)
    return out


def snapshot_is_exact(model, x, state: ModelState) -> bool:
    """An async snapshot, written after three more train steps, holds the values of its moment bit for bit."""
    want = [np.array(a) for a in _arrays(model)]
    snap = state.snapshot(copy=True)
    for _ in range(3):
        model.train_on_batch(x, x)
    jax.block_until_ready(_arrays(model))
    got = snap.arrays()
    snap.busy = False
    moved = any(not np.array_equal(np.asarray(a), w) for a, w in zip(_arrays(model), want, strict=True))
    return moved and len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def contender(name: str, workdir: str, epochs: int):
    d = os.path.join(workdir, name.replace(" ", "-"))
    os.makedirs(d, exist_ok=True)
    params = {"ckpt_directory": d, "epochs": epochs, "ckpt_save_best_metric": "loss"}
    if name == "candle_ckpt async":
        params["ckpt_async"] = True
    if name.startswith("candle_ckpt"):
        return CandleCheckpointCallback(params, logger=None, verbose=False)
    import keras  # noqa: PLC0415

    return keras.callbacks.OrbaxCheckpoint(os.path.join(d, "orbax"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-mib", type=float, default=256.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--compute-s", type=float, default=1.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, x = build_model(args.state_mib)
    device = jax.devices()[0]
    result = {
        "device": f"{device.platform}: {getattr(device, 'device_kind', '')}",
        "jax": jax.__version__,
        "python": platform.python_version(),
        "state_mib": args.state_mib,
        **floors(model, x, args.reps),
        "stall_s": {},
    }
    names = ["candle_ckpt sync", "candle_ckpt async"]
    try:
        import orbax.checkpoint  # noqa: F401, PLC0415

        names.append("OrbaxCheckpoint")
    except ImportError:
        result["orbax"] = "not installed"
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            fit = run_fit(model, x, args.epochs, args.compute_s, contender(name, work, args.epochs))
            stall = {"median": fit["stall_s"], "all": fit["stalls"], "train_end_s": fit["train_end_s"]}
            result["stall_s"][name] = stall
    mib = result["state_bytes"] / 2**20
    print(f"device: {result['device']}  state: {mib:.1f} MiB in {result['arrays']} arrays")
    for key in (
        "snapshot_async_s",
        "snapshot_sync_s",
        "per_array_asarray_s",
        "device_get_s",
        "pinned_d2h_s",
        "pinned_then_numpy_s",
    ):
        value = result[key]
        rate = f"{mib / 1024 / value:7.2f} GiB/s" if value else ""
        print(f"  {key:18s} {value if value is None else f'{value * 1e3:9.2f} ms'}  {rate}")
    if result.get("pinned_d2h_s"):
        print(f"  snapshot (async) / pinned copy: {result['snapshot_async_s'] / result['pinned_d2h_s']:.2f}x")
    print(f"  async snapshot holds its moment's values bit for bit after 3 more steps: {result['snapshot_exact']}")
    for name, s in result["stall_s"].items():
        print(f"  stall {name:20s} {s['median'] * 1e3:9.2f} ms   train end {s['train_end_s'] * 1e3:8.1f} ms")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
