"""Checkpoint stall and restart time: candle_ckpt (sync, async) against Keras's own callbacks.

One run, one model, side by side::

    python benchmarks/bench_checkpoint.py --state-mib 768 --out results.json
    python benchmarks/bench_checkpoint.py --quick            # 64 MiB smoke run

Model: ``Dense(2048)`` layers (2048x2048 kernels) trained with Adam, so the
state is weights + two Adam moments, about 48 MiB per layer; the number of
layers is the one closest to ``--state-mib`` (the table prints the exact size).

How each number is measured (medians; page cache warm, as in a restart on the
same node right after the save):

* **stall**: every contender's callback is wrapped and only its
  ``on_epoch_end`` is timed, during a real ``fit``. Each epoch is one training
  step plus a simulated compute phase (a sleep, ``--compute-s``; by default
  twice the raw write time) so that async writes overlap with "compute" as
  they would in real training. ``on_train_end`` (the final join of the async
  writer) is timed separately. ``epoch overhead`` is the median epoch wall
  time minus that of a run with no checkpoint callback (noisier; it would
  also catch costs deferred into the training step).
* **limits**, on the very arrays of the model state: a host snapshot (a
  memcpy into preallocated buffers), a raw ``h5py`` write + ``fsync`` of
  those arrays (native driver), and a raw ``h5py`` read of that file. The
  memcpy is also timed as a callback's ``on_epoch_end`` in a fit like the
  contenders' (right after a training step, TF's threads and caches make it
  slower than in isolation); the async-stall target compares against that
  one, like for like. The raw write + fsync is timed the same way, at each
  epoch end of a fit, into a new file per epoch while the earlier ones stay
  on disk, exactly as the sync contender (which retains every checkpoint)
  writes; the sync-save target compares against that one. The isolated
  figure rewrites one file after deleting it, so the filesystem hands back
  the blocks it just freed: on the dev machine's virtual disk that alone
  made a write ~30% faster than one into fresh blocks (1.44 s against
  2.0 s at 768 MiB), which is a property of the disk, not of the writer.
* **restart**: ``candle_ckpt.restart`` (find ``last``, validate the sidecar,
  CRC32 every file, load weights and optimizer) against stock
  ``model.load_weights`` of the same ``.weights.h5``, after one warm-up,
  the two interleaved.
* **retained**: the same sync save stall and restart time in a directory that
  already holds 10, then 1000 checkpoints. The retained checkpoints are made
  cheaply: every ``epochs/NNN`` holds hard links to one real checkpoint's
  files and its own valid sidecar, so the store sees 1000 committed,
  verifiable checkpoints without 1000 copies of the data.

* **memory**: the peak extra resident memory of candle_ckpt sync, async and
  ``ModelCheckpoint(.weights.h5)``, each in a fresh process: the peak RSS
  (sampled every 2 ms) of a fit with the callback minus that of the same fit
  without one, so training's own temporaries cancel out.

Targets (the issue's, meant for 768 MiB) are printed with PASS/FAIL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import h5py  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from candle_ckpt import CandleCheckpointCallback, restart  # noqa: E402
from candle_ckpt.core import layout as L  # noqa: E402
from candle_ckpt.keras.state import ModelState  # noqa: E402
from candle_ckpt.storage.store import CheckpointStore, release_lock  # noqa: E402

LAYER_MIB = 3 * (2048 * 2048 + 2048) * 4 / 2**20  # kernel + bias, and two Adam moments of each


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def timeit(fn, reps: int, setup=None) -> float:
    times = []
    for _ in range(reps):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


# -- the model -----------------------------------------------------------------------
def build_model(state_mib: float) -> tuple[keras.Model, np.ndarray]:
    layers = max(1, round(state_mib / LAYER_MIB))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2048,))] + [keras.layers.Dense(2048) for _ in range(layers)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse", jit_compile=False)
    x = np.random.RandomState(0).rand(8, 2048).astype("float32")
    model.fit(x, x, epochs=1, batch_size=8, verbose=0)  # builds the optimizer's variables
    return model, x


# -- wrapping a contender to time it ----------------------------------------------------
class Timed(keras.callbacks.Callback):
    """Forwards every hook to ``inner`` and times its ``on_epoch_end`` and ``on_train_end``."""

    def __init__(self, inner: keras.callbacks.Callback) -> None:
        super().__init__()
        self.inner = inner
        self.epoch_end_s: list[float] = []
        self.train_end_s = 0.0

    def set_model(self, model) -> None:
        super().set_model(model)
        self.inner.set_model(model)

    def set_params(self, params) -> None:
        super().set_params(params)
        self.inner.set_params(params)

    def on_train_begin(self, logs=None) -> None:
        self.inner.on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.inner.on_epoch_begin(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self.inner.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.inner.on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None) -> None:
        start = time.perf_counter()
        self.inner.on_epoch_end(epoch, logs)
        self.epoch_end_s.append(time.perf_counter() - start)

    def on_train_end(self, logs=None) -> None:
        start = time.perf_counter()
        self.inner.on_train_end(logs)
        self.train_end_s = time.perf_counter() - start


class Compute(keras.callbacks.Callback):
    """The simulated compute phase of each epoch; also records when each epoch starts."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.starts: list[float] = []

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.starts.append(time.perf_counter())
        time.sleep(self.seconds)

    def on_train_end(self, logs=None) -> None:
        self.starts.append(time.perf_counter())

    def epoch_wall(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]


class MemcpyAtEpochEnd(keras.callbacks.Callback):
    """The host-snapshot limit measured where the stall is: one memcpy of every
    variable into preallocated buffers at each epoch end, during the same fit."""

    def on_train_begin(self, logs=None) -> None:
        variables = list(self.model.variables) + list(self.model.optimizer.variables)
        self.variables = variables
        self.buffers = [np.empty_like(np.asarray(v.value.read_value())) for v in variables]

    def on_epoch_end(self, epoch, logs=None) -> None:
        for buf, v in zip(self.buffers, self.variables, strict=True):
            np.copyto(buf, np.asarray(v.value.read_value()))


class RawWriteAtEpochEnd(keras.callbacks.Callback):
    """The raw-write limit measured where the sync stall is: at each epoch end of
    the same kind of fit, a bare ``h5py`` write + ``fsync`` of the same arrays
    (native driver) into a new file, keeping every earlier file as a store
    that retains its checkpoints does (so both write into fresh disk blocks)."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    def on_train_begin(self, logs=None) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self.state = ModelState(self.model)

    def on_epoch_end(self, epoch, logs=None) -> None:
        write_raw_h5(os.path.join(self.directory, f"raw-{epoch:03d}.h5"), self.state.snapshot(copy=False).arrays())


def write_raw_h5(path: str, arrays: list[np.ndarray]) -> None:
    """The bare minimum a durable HDF5 checkpoint takes: one dataset per array, then fsync."""
    with h5py.File(path, "w") as f:
        for i, a in enumerate(arrays):
            f.create_dataset(f"vars/{i}", data=a)
        f.flush()
        os.fsync(f.id.get_vfd_handle())


def run_fit(model, x, epochs: int, compute_s: float, contender=None, initial_epoch: int = 0) -> dict:
    clock = Compute(compute_s)
    timed = Timed(contender) if contender is not None else None
    callbacks = [clock] + ([timed] if timed else [])
    model.fit(
        x,
        x,
        epochs=initial_epoch + epochs,
        initial_epoch=initial_epoch,
        batch_size=8,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    out = {"epoch_wall_s": median(clock.epoch_wall())}
    if timed is not None:
        out.update(stall_s=median(timed.epoch_end_s), stalls=timed.epoch_end_s, train_end_s=timed.train_end_s)
    return out


def candle_params(directory: str, epochs: int, async_save: bool, keep: int = 10**6) -> dict:
    return {
        "ckpt_directory": directory,
        "epochs": epochs,
        "ckpt_save_interval": 1,
        "ckpt_save_best": False,
        "ckpt_save_weights_only": True,
        "ckpt_keep_limit": keep,
        "ckpt_async": async_save,
        "ckpt_restart_mode": "required",
    }


def close_candle(directory: str) -> None:
    """Let a later callback in this process open the same directory (one writer lock per process)."""
    release_lock(L.Layout.at(directory).lock)


# -- limits ----------------------------------------------------------------------------
def limits(model, workdir: str, reps: int) -> dict:
    snap = ModelState(model).snapshot()
    arrays = [a for _, _, items in snap.entries for _, a in items]
    nbytes = sum(a.nbytes for a in arrays)
    dst = [np.empty_like(a) for a in arrays]
    for d, a in zip(dst, arrays, strict=True):  # touch the pages once: a memcpy, not page faults
        np.copyto(d, a)
    memcpy = timeit(lambda: [np.copyto(d, a) for d, a in zip(dst, arrays, strict=True)], reps)
    fresh = timeit(lambda: [a.copy() for a in arrays], reps)
    dst.clear()  # free the buffers before the file tests
    path = os.path.join(workdir, "raw.h5")

    def write() -> None:
        write_raw_h5(path, arrays)

    def unlink() -> None:
        if os.path.exists(path):
            os.unlink(path)

    raw_write = timeit(write, reps, setup=unlink)

    def read() -> None:
        with h5py.File(path, "r") as f:
            for i in range(len(arrays)):
                f[f"vars/{i}"][()]

    raw_read = timeit(read, reps)
    unlink()
    return {
        "state_bytes": nbytes,
        "snapshot_memcpy_s": memcpy,
        "snapshot_fresh_copy_s": fresh,
        "raw_h5py_write_fsync_s": raw_write,
        "raw_h5py_read_s": raw_read,
    }


# -- restart -----------------------------------------------------------------------------
def restart_times(model, directory: str, reps: int) -> dict:
    store = CheckpointStore(directory)
    last = store.link_epoch("last")
    weights = os.path.join(store.layout.epoch_dir(last), L.WEIGHTS_FILE)
    params = candle_params(directory, 1, False)
    restart(params, model, logger=None, verbose=False)  # warm-up: the first assign traces TF functions
    candle, stock = [], []
    for _ in range(reps):  # interleaved, so that a busy moment hits both alike
        candle.append(timeit(lambda: restart(params, model, logger=None, verbose=False), 1))
        stock.append(timeit(lambda: model.load_weights(weights), 1))
    return {"candle_restart_s": median(candle), "keras_load_weights_s": median(stock)}


# -- retained checkpoints ----------------------------------------------------------------
def make_retained(directory: str, source: str, count: int) -> None:
    """Fill ``directory`` with ``count`` committed checkpoints sharing one real checkpoint's data."""
    src = CheckpointStore(source)
    epoch = src.link_epoch("last")
    side = src.read_sidecar(epoch)
    lay = L.Layout.at(directory)
    os.makedirs(lay.epochs, exist_ok=True)
    for e in range(1, count + 1):
        d = lay.epoch_dir(e)
        os.makedirs(d)
        for name in side.files:
            os.link(os.path.join(src.layout.epoch_dir(epoch), name), os.path.join(d, name))
        with open(os.path.join(d, L.SIDECAR), "wb") as f:
            f.write(dataclasses.replace(side, epoch=e, generation=e).to_json())
    os.symlink(L.link_target(count), lay.link("last"))


def retained(model, x, workdir: str, source: str, counts: list[int], epochs: int, reps: int) -> dict:
    """Save and restart times with ``counts`` checkpoints retained. Every directory stays
    until all counts are done, so each run's saves write into fresh disk blocks."""
    out, made = {}, []
    for count in counts:
        d = os.path.join(workdir, f"retained-{count}")
        make_retained(d, source, count)
        start = time.perf_counter()
        cb = CandleCheckpointCallback(candle_params(d, count + epochs, False, keep=10**6), logger=None, verbose=False)
        open_s = time.perf_counter() - start
        fit = run_fit(model, x, epochs, 0.0, cb, initial_epoch=count)
        close_candle(d)
        out[str(count)] = {
            "open_s": open_s,
            "save_stall_s": fit["stall_s"],
            "restart_s": restart_times(model, d, reps)["candle_restart_s"],
        }
        made.append(d)
    for d in made:
        shutil.rmtree(d)
    return out


# -- peak host memory ----------------------------------------------------------------------
class PeakRss:
    """Samples this process's resident set size on a thread; ``peak`` is the highest seen (bytes)."""

    def __init__(self, every_s: float = 0.002) -> None:
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakRss:
        self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


MEMORY_CONTENDERS = ("candle_ckpt sync", "candle_ckpt async", "ModelCheckpoint(.weights.h5)")


def probe_memory(name: str, state_mib: int, epochs: int, compute_s: float, directory: str) -> dict:
    """Peak extra RSS of one contender, in a fresh process: the peak of a fit with the
    callback minus the peak of the same fit without one (training's own temporaries
    cancel out; memory the first fit freed is reused by the second, as in a real job)."""
    model, x = build_model(state_mib)
    state_bytes = ModelState(model).snapshot(copy=False).nbytes
    run_fit(model, x, epochs, compute_s)  # warm-up: first-time allocations of training itself
    with PeakRss() as bare:
        run_fit(model, x, epochs, compute_s)
    d = os.path.join(directory, "memory")
    cb = {
        "candle_ckpt sync": lambda: CandleCheckpointCallback(candle_params(d, epochs, False), logger=None),
        "candle_ckpt async": lambda: CandleCheckpointCallback(candle_params(d, epochs, True), logger=None),
        "ModelCheckpoint(.weights.h5)": lambda: keras.callbacks.ModelCheckpoint(
            os.path.join(d, "model.weights.h5"), save_weights_only=True
        ),
    }[name]()
    with PeakRss() as saving:
        run_fit(model, x, epochs, compute_s, cb)
    return {"state_bytes": state_bytes, "peak_extra_bytes": saving.peak - bare.peak}


def memory(args: argparse.Namespace, workdir: str, compute_s: float) -> dict:
    """Run :func:`probe_memory` for each of MEMORY_CONTENDERS in its own process."""
    out = {}
    for name in MEMORY_CONTENDERS:
        cmd = [sys.executable, __file__, "--state-mib", str(args.state_mib), "--probe-memory", name]
        cmd += ["--compute-s", str(compute_s), "--dir", workdir]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"memory probe {name!r} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        out[name] = json.loads(lines[-1])
    return out


# -- the run -----------------------------------------------------------------------------
def contenders(workdir: str, epochs: int):
    def candle(name: str, async_save: bool):
        d = os.path.join(workdir, name)
        return d, CandleCheckpointCallback(candle_params(d, epochs, async_save), logger=None, verbose=False)

    yield "candle_ckpt sync", *candle("candle-sync", False)
    yield "candle_ckpt async", *candle("candle-async", True)
    d = os.path.join(workdir, "mc-weights")
    yield (
        "ModelCheckpoint(.weights.h5)",
        d,
        keras.callbacks.ModelCheckpoint(os.path.join(d, "model.weights.h5"), save_weights_only=True),
    )
    d = os.path.join(workdir, "mc-keras")
    yield "ModelCheckpoint(.keras)", d, keras.callbacks.ModelCheckpoint(os.path.join(d, "model.keras"))
    d = os.path.join(workdir, "backup")
    yield "BackupAndRestore", d, keras.callbacks.BackupAndRestore(d, delete_checkpoint=False)


def machine() -> dict:
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "h5py": h5py.__version__,
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def run(args: argparse.Namespace) -> dict:
    workdir = tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir)
    try:
        model, x = build_model(args.state_mib)
        lim = limits(model, workdir, args.reps)
        compute_s = args.compute_s if args.compute_s is not None else max(0.1, 2 * lim["raw_h5py_write_fsync_s"])
        baseline = run_fit(model, x, args.epochs, compute_s)
        lim["snapshot_memcpy_in_fit_s"] = run_fit(model, x, args.epochs, compute_s, MemcpyAtEpochEnd())["stall_s"]
        # Kept until the candle sync run is done, so that it too writes into fresh blocks.
        raw_dir = os.path.join(workdir, "raw-in-fit")
        raw = run_fit(model, x, args.epochs, compute_s, RawWriteAtEpochEnd(raw_dir))
        lim["raw_h5py_write_fsync_in_fit_s"] = raw["stall_s"]
        rows = {}
        for name, d, cb in contenders(workdir, args.epochs):
            result = run_fit(model, x, args.epochs, compute_s, cb)
            result["epoch_overhead_s"] = result["epoch_wall_s"] - baseline["epoch_wall_s"]
            rows[name] = result
            if name == "candle_ckpt sync":
                shutil.rmtree(raw_dir)
                close_candle(d)
                rows["restart"] = restart_times(model, d, args.reps)
                kept = d  # the source of the retained-checkpoint test
            else:
                if name == "candle_ckpt async":
                    close_candle(d)
                shutil.rmtree(d, ignore_errors=True)
        ret = retained(model, x, workdir, kept, [10, args.retained], args.retained_epochs, args.reps)
        layers = len(model.layers)
        del model  # the probes run in their own processes; free this one's state first
        mem = memory(args, workdir, compute_s)
        return {
            "state_mib_requested": args.state_mib,
            "state_mib": lim["state_bytes"] / 2**20,
            "layers": layers,
            "epochs": args.epochs,
            "compute_s": compute_s,
            "machine": machine(),
            "limits": lim,
            "baseline_epoch_wall_s": baseline["epoch_wall_s"],
            "contenders": {k: v for k, v in rows.items() if k != "restart"},
            "restart": rows["restart"],
            "retained": ret,
            "memory": mem,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def targets(r: dict) -> list[tuple[str, float, float, bool]]:
    lim, c, rs, ret = r["limits"], r["contenders"], r["restart"], r["retained"]
    a, s = c["candle_ckpt async"]["stall_s"], c["candle_ckpt sync"]["stall_s"]
    mc = c["ModelCheckpoint(.weights.h5)"]["stall_s"]
    few, many = ret["10"], ret[max(ret, key=int)]
    mem = r["memory"]["candle_ckpt async"]
    checks = [
        ("async stall / host snapshot (memcpy at epoch end)", a / lim["snapshot_memcpy_in_fit_s"], 1.5),
        ("async stall / ModelCheckpoint(.weights.h5) stall", a / mc, 0.5),
        ("sync save / raw h5py write+fsync (epoch end in fit)", s / lim["raw_h5py_write_fsync_in_fit_s"], 1.25),
        ("restart (CRC) / keras load_weights", rs["candle_restart_s"] / rs["keras_load_weights_s"], 1.25),
        ("save, many retained / 10 retained", many["save_stall_s"] / few["save_stall_s"], 1.1),
        ("restart, many retained / 10 retained", many["restart_s"] / few["restart_s"], 1.1),
        ("async peak extra host memory / state size", mem["peak_extra_bytes"] / mem["state_bytes"], 1.1),
    ]
    return [(name, ratio, limit, ratio <= limit) for name, ratio, limit in checks]


def report(r: dict) -> str:
    ms = lambda s: f"{s * 1000:9.1f}"  # noqa: E731
    lim = r["limits"]
    lines = [
        f"state {r['state_mib']:.1f} MiB ({r['layers']} Dense 2048x2048 layers, Adam), "
        f"{r['epochs']} epochs, compute phase {r['compute_s']:.3f} s/epoch",
        f"machine: {r['machine'].get('cpu', '?')}, {r['machine']['cpus']} CPUs, "
        f"{r['machine'].get('mem_gib', '?')} GiB, keras {r['machine']['keras']} ({r['machine']['backend']})",
        "",
        f"{'contender':34} {'stall ms':>9} {'train_end ms':>12} {'epoch overhead ms':>17}",
    ]
    for name, c in r["contenders"].items():
        lines.append(f"{name:34} {ms(c['stall_s'])} {ms(c['train_end_s']):>12} {ms(c['epoch_overhead_s']):>17}")
    lines += [
        "",
        f"{'limit (same arrays)':34} {'ms':>9}",
        f"{'host snapshot (memcpy)':34} {ms(lim['snapshot_memcpy_s'])}",
        f"{'  the same, at epoch end in fit':34} {ms(lim['snapshot_memcpy_in_fit_s'])}",
        f"{'host copy into new memory':34} {ms(lim['snapshot_fresh_copy_s'])}",
        f"{'raw h5py write + fsync':34} {ms(lim['raw_h5py_write_fsync_s'])}",
        f"{'  the same, at epoch end in fit':34} {ms(lim['raw_h5py_write_fsync_in_fit_s'])}",
        f"{'raw h5py read':34} {ms(lim['raw_h5py_read_s'])}",
        "",
        f"{'restart':34} {'ms':>9}",
        f"{'candle_ckpt restart (CRC verify)':34} {ms(r['restart']['candle_restart_s'])}",
        f"{'keras load_weights':34} {ms(r['restart']['keras_load_weights_s'])}",
        "",
        f"{'retained checkpoints':34} {'save ms':>9} {'restart ms':>12} {'open ms':>9}",
    ]
    for count, v in r["retained"].items():
        lines.append(f"{count:>34} {ms(v['save_stall_s'])} {ms(v['restart_s']):>12} {ms(v['open_s'])}")
    lines += ["", f"{'peak extra host memory (RSS)':34} {'MiB':>9} {'x state':>12}"]
    for name, v in r["memory"].items():
        lines.append(f"{name:34} {v['peak_extra_bytes'] / 2**20:9.1f} {v['peak_extra_bytes'] / v['state_bytes']:12.2f}")
    lines += ["", "targets:"]
    for name, ratio, limit, ok in targets(r):
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {name:50} {ratio:6.2f}x  (<= {limit}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-mib", type=int, choices=(64, 768, 3072), default=768, help="model state size")
    p.add_argument("--quick", action="store_true", help="64 MiB, few epochs and repetitions (a smoke run)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per contender (default 7; quick 4)")
    p.add_argument("--reps", type=int, default=None, help="repetitions of each limit/restart timing (5; quick 3)")
    p.add_argument("--compute-s", type=float, default=None, help="simulated compute per epoch (default 2x raw write)")
    p.add_argument("--retained", type=int, default=1000, help="the 'many retained checkpoints' count")
    p.add_argument("--retained-epochs", type=int, default=None, help="saves timed per retained count (5; quick 3)")
    p.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--probe-memory", choices=MEMORY_CONTENDERS, help=argparse.SUPPRESS)  # internal: one probe
    args = p.parse_args(argv)
    if args.probe_memory:
        workdir = tempfile.mkdtemp(prefix="bench-mem-", dir=args.dir)
        try:
            compute_s = 0.5 if args.compute_s is None else args.compute_s
            print(json.dumps(probe_memory(args.probe_memory, args.state_mib, 4, compute_s, workdir)))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0
    if args.quick:
        args.state_mib = 64
    args.epochs = args.epochs or (4 if args.quick else 7)
    args.reps = args.reps or (3 if args.quick else 5)
    args.retained_epochs = args.retained_epochs or (3 if args.quick else 5)
    result = run(args)
    result["targets"] = [{"name": n, "ratio": q, "limit": lim, "pass": ok} for n, q, lim, ok in targets(result)]
    print(report(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
