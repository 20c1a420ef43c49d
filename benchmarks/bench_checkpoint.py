"""Checkpoint stall, restart time and memory: candle_ckpt against Keras's own callbacks and Orbax.

One run, one model per state size, every contender side by side::

    pip install -e .[bench]                     # orbax-checkpoint and matplotlib
    python benchmarks/bench_checkpoint.py                      # 64 and 768 MiB
    python benchmarks/bench_checkpoint.py --sizes 64 768 3072  # and 3 GiB (slow on 2 cores)

Writes ``benchmarks/results/bench-<UTC time>.json`` and a PNG of stall against
state size beside it, and prints a table.

Model: ``Dense(2048)`` layers trained with Adam, so the state is weights + two
Adam moments, 48 MiB per layer; the number of layers is the one closest to the
size asked for (the table prints the exact size).

Contenders, each at its defaults, each in its own ``fit`` of the same model:
Keras ``ModelCheckpoint`` (``.keras``, its default) and
``ModelCheckpoint(.weights.h5)``, ``BackupAndRestore``, Keras 3.15's
``OrbaxCheckpoint`` (asynchronous, orbax-checkpoint from PyPI), and
candle_ckpt sync and async, each at the defaults (one ``model.keras``) and with
``ckpt_save_weights_only``. candle_ckpt's defaults include a CRC-32 of every
file and an fsync of every file and directory; Keras's callbacks fsync nothing.

How each number is measured (medians; page cache warm, as in a restart on the
same node right after the save):

* **stall**: only the contender's ``on_epoch_end`` is timed, during a real
  ``fit``. Each epoch is one training step plus a simulated compute phase (a
  sleep, ``--compute-s``; by default twice the raw write + fsync time at an
  epoch end, the slower of its two measurements below) so that async writes
  overlap with "compute" as in real training. ``on_train_end`` (the
  final join of an async writer) is reported separately.
* **limits**, on the very arrays of the model state, timed at each epoch end
  of the same kind of fit: a host snapshot (a memcpy into preallocated
  buffers) and a raw ``h5py`` write + ``fsync`` into a new file per epoch.
* **restart**: ``candle_ckpt.restart`` (find ``last``, validate the sidecar,
  CRC-32 every file, load weights and optimizer) of the default checkpoint and
  of a weights-only one, against stock ``model.load_weights`` of a
  ``.weights.h5`` of the same state; after one warm-up, interleaved.
* **memory**: the peak extra resident memory of a contender, each in a fresh
  process: the peak RSS (sampled every 2 ms) of a fit with the callback minus
  that of the same fit without one (training's own temporaries cancel out).

The issue's targets (for 768 MiB) are computed from these numbers with
PASS/FAIL for every size run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_report as R  # noqa: E402
import keras  # noqa: E402
from bench_lib import (  # noqa: E402
    MemcpyAtEpochEnd,
    PeakRss,
    RawWriteAtEpochEnd,
    build_model,
    machine,
    median,
    run_fit,
    write_raw_h5,
)
from bench_retained import retained  # noqa: E402

from candle_ckpt import CandleCheckpointCallback, restart  # noqa: E402
from candle_ckpt.core import layout as L  # noqa: E402
from candle_ckpt.keras.state import ModelState  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HAVE_ORBAX = importlib.util.find_spec("orbax") is not None and importlib.util.find_spec("orbax.checkpoint") is not None
MEMORY_CONTENDERS = (R.ASYNC, R.SYNC, R.MC_KERAS, R.ORBAX)


def candle_params(directory: str, epochs: int, async_save: bool, weights_only: bool) -> dict:
    """candle_ckpt at its defaults; only the metric is ``loss`` (the benchmark has no validation data)."""
    params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_best_metric": "loss"}
    if async_save:
        params["ckpt_async"] = True
    if weights_only:
        params["ckpt_save_weights_only"] = True
    return params


def make_contender(name: str, workdir: str, epochs: int):
    """Return ``(callback, directory)`` for contender ``name``, writing under ``workdir``."""
    d = os.path.join(workdir, name.split(" (")[0].replace(" ", "-").replace("/", "") + f"-{abs(hash(name)) % 997}")
    os.makedirs(d, exist_ok=True)
    candle = {
        R.SYNC: (False, False),
        R.ASYNC: (True, False),
        "candle_ckpt sync, weights only": (False, True),
        "candle_ckpt async, weights only": (True, True),
    }
    if name in candle:
        return CandleCheckpointCallback(candle_params(d, epochs, *candle[name]), logger=None, verbose=False), d
    if name == R.MC_KERAS:
        return keras.callbacks.ModelCheckpoint(os.path.join(d, "model.keras")), d
    if name == "ModelCheckpoint (.weights.h5)":
        return keras.callbacks.ModelCheckpoint(os.path.join(d, "model.weights.h5"), save_weights_only=True), d
    if name == "BackupAndRestore (defaults)":
        return keras.callbacks.BackupAndRestore(d), d
    if name == R.ORBAX:
        return keras.callbacks.OrbaxCheckpoint(os.path.join(d, "orbax")), d
    raise ValueError(f"unknown contender {name!r}")


CONTENDERS = (
    R.MC_KERAS,
    "ModelCheckpoint (.weights.h5)",
    "BackupAndRestore (defaults)",
    R.ORBAX,
    R.SYNC,
    "candle_ckpt sync, weights only",
    R.ASYNC,
    "candle_ckpt async, weights only",
)


def raw_write_time(model, workdir: str, reps: int) -> float:
    """Median raw h5py write + fsync of the state, into one file deleted before each write."""
    arrays = ModelState(model).snapshot(copy=False).arrays()
    path, times = os.path.join(workdir, "raw.h5"), []
    for _ in range(reps):
        if os.path.exists(path):
            os.unlink(path)
        start = time.perf_counter()
        write_raw_h5(path, arrays)
        times.append(time.perf_counter() - start)
    os.unlink(path)
    return median(times)


def timed_median(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


def restart_times(model, default_dir: str, weights_dir: str, reps: int) -> dict:
    """candle_ckpt restart (defaults, weights only) against stock load_weights, interleaved."""
    p_default = {**candle_params(default_dir, 1, False, False), "ckpt_restart_mode": "required"}
    p_weights = {**candle_params(weights_dir, 1, False, True), "ckpt_restart_mode": "required"}
    h5 = os.path.join(weights_dir, "ckpts", "last", L.WEIGHTS_FILE)
    restart(p_default, model, logger=None, verbose=False)  # warm-up: the first assign traces TF functions
    model.load_weights(h5)
    keys = ("candle_restart_s", "candle_restart_weights_only_s", "keras_load_weights_s")
    times: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(reps):  # interleaved, so that a busy moment hits all alike
        for key, fn in (
            ("candle_restart_s", lambda: restart(p_default, model, logger=None, verbose=False)),
            ("candle_restart_weights_only_s", lambda: restart(p_weights, model, logger=None, verbose=False)),
            ("keras_load_weights_s", lambda: model.load_weights(h5)),
        ):
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    return {k: median(v) for k, v in times.items()}


def probe_memory(name: str, state_mib: float, epochs: int, compute_s: float, directory: str) -> dict:
    """Peak extra RSS of one contender in this (fresh) process: the peak of a fit with the
    callback minus the peak of the same fit without one."""
    model, x = build_model(state_mib)
    state_bytes = ModelState(model).snapshot(copy=False).nbytes
    run_fit(model, x, 1, compute_s)  # warm-up: first-time allocations of training itself
    with PeakRss() as bare:
        run_fit(model, x, epochs, compute_s)
    cb, _ = make_contender(name, directory, epochs)
    with PeakRss() as saving:
        run_fit(model, x, epochs, compute_s, cb)
    return {"state_bytes": state_bytes, "peak_extra_bytes": saving.peak - bare.peak}


def memory(state_mib: float, workdir: str, compute_s: float) -> dict:
    """Run :func:`probe_memory` for each of MEMORY_CONTENDERS in its own process."""
    out = {}
    for name in MEMORY_CONTENDERS:
        if name == R.ORBAX and not HAVE_ORBAX:
            continue
        cmd = [sys.executable, __file__, "--probe-memory", name, "--sizes", str(state_mib)]
        cmd += ["--compute-s", str(compute_s), "--dir", workdir]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"memory probe {name!r} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        out[name] = json.loads(lines[-1])
    return out


def run_size(args: argparse.Namespace, state_mib: float, with_memory: bool) -> dict:
    """Every contender, the limits and restart at one state size."""
    workdir = tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir)
    try:
        model, x = build_model(state_mib)
        state_bytes = ModelState(model).snapshot(copy=False).nbytes
        raw = raw_write_time(model, workdir, args.reps)
        lim = {"raw_h5py_write_fsync_s": raw}
        raw_dir = os.path.join(workdir, "raw-in-fit")
        fit = run_fit(model, x, args.epochs, max(0.1, 2 * raw), RawWriteAtEpochEnd(raw_dir))
        lim["raw_h5py_write_fsync_in_fit_s"] = fit["stall_s"]
        # Twice the slower raw write: a writer as fast as bare h5py, writing into new
        # blocks while training runs, has the time to finish before the next epoch end.
        compute_s = args.compute_s if args.compute_s is not None else max(0.1, 2 * raw, 2 * fit["stall_s"])
        baseline = run_fit(model, x, args.epochs, compute_s)
        lim["snapshot_memcpy_in_fit_s"] = run_fit(model, x, args.epochs, compute_s, MemcpyAtEpochEnd())["stall_s"]
        shutil.rmtree(raw_dir)
        rows, kept = {}, {}
        for name in CONTENDERS:
            if name == R.ORBAX and not HAVE_ORBAX:
                rows[name] = {"skipped": "no orbax"}
                continue
            cb, d = make_contender(name, workdir, args.epochs)
            row = run_fit(model, x, args.epochs, compute_s, cb)
            row["epoch_overhead_s"] = row["epoch_wall_s"] - baseline["epoch_wall_s"]
            rows[name] = row
            if name.startswith("candle_ckpt"):
                cb.close()  # fit has released the writer lock already; this only makes sure
            if name in (R.SYNC, "candle_ckpt sync, weights only"):
                kept[name] = d  # restart reads these
            else:
                shutil.rmtree(d, ignore_errors=True)
        restart_s = restart_times(model, kept[R.SYNC], kept["candle_ckpt sync, weights only"], args.reps)
        ret = None
        if args.retained:

            def restart_time(d: str, m=model) -> float:
                p = {**candle_params(d, 1, False, False), "ckpt_restart_mode": "required"}
                return timed_median(lambda: restart(p, m, logger=None, verbose=False), args.reps)

            ret = retained(model, x, workdir, kept[R.SYNC], [10, args.retained], 5, restart_time)
        for d in kept.values():
            shutil.rmtree(d, ignore_errors=True)
        layers = len(model.layers)
        del model  # the memory probes run in their own processes
        out = {
            "state_mib_requested": state_mib,
            "state_mib": state_bytes / 2**20,
            "state_bytes": state_bytes,
            "layers": layers,
            "epochs": args.epochs,
            "compute_s": compute_s,
            "limits": lim,
            "baseline_epoch_wall_s": baseline["epoch_wall_s"],
            "contenders": rows,
            "restart": restart_s,
            "memory": memory(state_mib, workdir, compute_s) if with_memory else None,
            "retained": ret,
        }
        out["targets"] = R.targets(out)
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[64, 768], help="state sizes in MiB (3 GiB: 3072)")
    p.add_argument("--epochs", type=int, default=7, help="epochs (so epoch ends) per contender; the median is taken")
    p.add_argument("--reps", type=int, default=5, help="repetitions of the raw write and of each restart timing")
    p.add_argument("--compute-s", type=float, default=None, help="simulated compute per epoch (default 2x raw write)")
    p.add_argument("--memory-at", type=float, default=None, help="size to probe memory at (default: 768 if run)")
    p.add_argument("--retained", type=int, default=0, help="also time save/restart with 10 and N retained (opt-in)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory probes (fresh processes; slow)")
    p.add_argument("--dir", default=None, help="where to write checkpoints (default: the system temp dir)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/bench-<UTC time>.json)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG (matplotlib)")
    p.add_argument("--rst-from", metavar="JSON", help="print the tables of a saved run as reStructuredText, and exit")
    p.add_argument("--probe-memory", choices=MEMORY_CONTENDERS, help=argparse.SUPPRESS)  # internal: one probe
    args = p.parse_args(argv)
    if args.rst_from:
        print(R.rst(json.loads(Path(args.rst_from).read_text())))
        return 0
    if args.probe_memory:
        workdir = tempfile.mkdtemp(prefix="bench-mem-", dir=args.dir)
        try:
            compute_s = 0.5 if args.compute_s is None else args.compute_s
            print(json.dumps(probe_memory(args.probe_memory, args.sizes[0], 3, compute_s, workdir)))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0
    if args.epochs < 1 or args.reps < 1 or any(s <= 0 for s in args.sizes):
        p.error("--epochs and --reps must be >= 1 and every --sizes value > 0")
    memory_at = args.memory_at if args.memory_at is not None else (R.TARGET_MIB if R.TARGET_MIB in args.sizes else None)
    started = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "started_utc": started,
        "machine": machine(),
        "sizes": {},
    }
    for size in args.sizes:
        result["sizes"][f"{size:g}"] = run_size(args, size, with_memory=not args.no_memory and size == memory_at)
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(R.report(result))
    out = Path(args.out) if args.out else RESULTS / f"bench-{started}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}")
    if not args.no_plot:
        R.plot(result, str(out.with_suffix(".png")))
        print(f"wrote {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
