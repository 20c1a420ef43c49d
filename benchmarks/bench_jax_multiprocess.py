"""Side by side in a 2-process JAX job: candle_ckpt (sync, async) against Keras's ``OrbaxCheckpoint``.

Usage::

    python3 benchmarks/bench_jax_multiprocess.py [--mib 256 1024] [--epochs 8] [--steps 2] [--out-dir DIR]

Each contender runs the same job: 2 processes x 2 CPU devices (gloo), ModelParallel with the big
kernels sharded over all 4 devices, Adam (so the state is about 3x the weights), ``--mib`` MiB of
state in all, ``--steps`` steps of 8 samples per epoch. One JSON per size is written into
``--out-dir`` (default: ``$OUT`` if set), named ``jax-multiprocess-<mib>.json``. Per contender it
reports, from process 0:

- ``stall_s``: the mean extra wall time of an epoch end over the run without checkpointing (the
  first epoch, which compiles, is left out, and so is the last, whose end also waits for the last
  write of an async contender: that wait is ``end_wait_s``). For candle_ckpt also, from ``callback.stats()``:
  ``async_writer`` (True: the writes ran on the background writer), ``snapshot_s`` (the copy taken
  on the training thread), ``writer_wait_s`` (the training thread waiting for the previous write:
  the writer cannot keep up when an epoch is shorter than a write) and ``save_s`` (one commit);
- ``blocked_per_save_s``: the training thread's time inside the contender's hooks (every ``on_*`` it defines but
  ``on_train_begin``, and candle_ckpt's ``_before_epoch`` / ``_after_epoch`` that run around every callback's epoch
  hooks; ``on_train_end``, an async writer's final join, apart), divided by the saves of the run (Orbax: one an
  epoch; candle_ckpt: its commits, from ``stats()``), the larger of the two processes' (``blocked``: each
  process's, ``blocked_by_hook_s``: by hook). It is what PyTorch DCP reports as blocking time, and unlike the
  stall it does not depend on how much the background writer slows the next epoch on a shared machine;
  ``blocked_vs_orbax`` the ratio;
- ``bytes_per_ckpt`` and ``bytes_ratio``: the bytes of the newest checkpoint's directory, against the
  state; ``checkpoints``, ``kept`` and ``bytes_on_disk``: the checkpoints the directory holds at the
  end, and all their bytes (candle_ckpt keeps ``best`` on top of ``ckpt_keep_limit`` when it is older
  than the last two: dividing all the bytes by 2 once made 3 checkpoints look like 1.5x the state);
- ``restart_s``: the first of ``--restarts`` (default 3) timed restores (all: ``restart_all_s``; their median:
  ``restart_median_s``; the first is a user's restart, the later ones show the spread of the disk's reads) of
  the last checkpoint into a fresh model whose optimizer is already
  built (for every contender: ``fit`` builds it anyway; building it is Keras's cost, not a
  checkpoint's), its files written back and dropped from the page cache first (a restart reads the
  disk, as after a crash), by candle_ckpt's ``restart()`` or Keras's ``model.load_weights`` of the Orbax
  directory; ``restored_equal``: whether every weight and optimizer variable then equals the
  trained model's, bit for bit, on both processes.

The machine's load average is recorded with the result: the machine may be shared.
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
RESTARTS = 3  # restarts timed per contender (--restarts)


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


def _newest(contender: str, directory: str) -> tuple[str | None, list[str]]:
    """The newest checkpoint's directory, and the checkpoints ``directory`` holds (candle_ckpt: ``last``/``best``
    marked)."""
    if contender.startswith("candle"):
        ckpts = os.path.join(directory, "ckpts")
        names = sorted(os.listdir(os.path.join(ckpts, "epochs"))) if os.path.isdir(ckpts) else []
        links = {n: os.path.basename(os.readlink(os.path.join(ckpts, n))) for n in ("last", "best")}
        held = [name + "".join(f" ({n})" for n, target in links.items() if target == name) for name in names]
        return os.path.realpath(os.path.join(ckpts, "last")), held
    if not os.path.isdir(directory):  # the run without checkpoints
        return None, []
    steps = sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True)
    return (os.path.join(directory, str(steps[0])) if steps else None), [str(n) for n in sorted(steps)]


def _evict(directory: str) -> None:
    """Write back, then drop from the page cache, every file under ``directory``: a restart reads from the disk,
    as after a crash or on another node (without it, a contender whose files are still cached would read memory)."""
    os.sync()
    for root, _, files in os.walk(directory):
        for name in files:
            full = os.path.join(root, name)
            if os.path.islink(full):
                continue
            fd = os.open(full, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _values(model) -> list:
    """This process's shards of every weight and optimizer variable, in order, on the host."""
    import numpy as np

    out = []
    for v in list(model.weights) + list(model.optimizer.variables):
        value = v.value
        shards = getattr(value, "addressable_shards", None)
        out.append([np.asarray(s.data) for s in shards] if shards is not None else [np.asarray(value)])
    return out


class HookTimer:
    """Times, on the training thread, every hook a contender defines (``on_*`` that is not Keras's default no-op,
    and candle_ckpt's ``_before_epoch`` / ``_after_epoch``, which its wrap of the callback list calls around every
    callback's epoch hooks): what PyTorch DCP reports as blocking time. ``on_train_begin`` is not wrapped (candle_ckpt
    finds ``fit`` from the frame above that hook), ``on_train_end`` (an async writer's last join) is kept apart.
    Nested timed calls count once."""

    def __init__(self, callback) -> None:
        from keras.src.utils.python_utils import is_default

        self.by_hook: dict[str, float] = {}
        self.depth = 0
        names = [n for n in dir(type(callback)) if n.startswith("on_") and n != "on_train_begin"]
        names += [n for n in ("_before_epoch", "_after_epoch") if hasattr(callback, n)]
        for name in names:
            method = getattr(callback, name)
            if callable(method) and not is_default(method):
                setattr(callback, name, self._timed(name, method))

    def _timed(self, name: str, method):
        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.by_hook[name] = self.by_hook.get(name, 0.0) + time.perf_counter() - start

        return timed


def blocked(by_hook: dict[str, float], saves: int) -> dict:
    """A process's time in the hooks on the training thread: per save (``on_train_end`` apart), and in all."""
    during = sum(v for k, v in by_hook.items() if k != "on_train_end")
    return {"per_save_s": during / max(1, saves), "train_end_s": by_hook.get("on_train_end", 0.0)}


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
    from jax.experimental import multihost_utils

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

        # Both batch-end hooks are defined so that Keras dispatches batch ends on the training thread for every
        # contender. Without them, Keras 3.15 reads the logs on a thread pool while the training thread runs on,
        # and 2-process jobs on the 2-core machine hung (2026-11-28): the run without checkpoints in fit, and
        # candle_ckpt's and Orbax's runs in the validation of fit (whose test batch ends neither callback
        # hooks), with the two processes in different computations (docs/multi-worker.rst, "Known hazard").
        def on_train_batch_end(self, batch, logs=None):
            pass

        def on_test_batch_end(self, batch, logs=None):
            pass

    params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_keep_limit": 2}
    callbacks: list = [Clock()]
    ours = timer = None
    if contender.startswith("candle"):
        params["ckpt_async"] = contender == "candle_async"
        ours = candle_ckpt.CandleCheckpointCallback(params, verbose=False)
        callbacks.append(ours)
    elif contender == "orbax":
        callbacks.append(keras.callbacks.OrbaxCheckpoint(directory, save_freq="epoch", max_to_keep=2))
    if len(callbacks) > 1:
        timer = HookTimer(callbacks[1])
    model.fit(x, x, batch_size=BATCH, epochs=epochs, validation_data=(x, x), verbose=0, callbacks=callbacks)
    end = time.perf_counter()
    state = sum(int(np.prod(v.shape)) * 4 for v in list(model.weights) + list(model.optimizer.variables))
    result: dict = {"state_bytes": state, "restart_s": None, "restored_equal": None}
    if timer is not None:
        result["blocked_by_hook_s"] = dict(sorted(timer.by_hook.items()))
        result["saves"] = epochs  # OrbaxCheckpoint(save_freq="epoch"): one a epoch; candle_ckpt's count is below
    if ours is not None:
        stats = ours.stats()
        saves = stats["saves"]  # the primary's commits (the other process writes its part, the primary commits)
        result["async_writer"] = stats["async"]
        result["writer_wait_s"] = sum(stats["writer_wait_s"]) / max(1, len(stats["writer_wait_s"]))
        result["snapshot_s"] = sum(r["snapshot_s"] for r in saves) / max(1, len(saves))
        result["save_s"] = sum(r["save_s"] for r in saves) / max(1, len(saves))
        result["saves"] = len(saves)  # the primary's commits (epoch and step checkpoints)
    if contender != "none":
        trained = _values(model)
        times_s, differ = [], set()
        try:
            for k in range(RESTARTS):
                fresh = _model(mib)
                fresh.optimizer.build(fresh.trainable_variables)  # fit builds it anyway: not part of a restore
                _evict(directory)
                multihost_utils.sync_global_devices(f"evicted {k}")  # both start the restore from a cold cache
                start = time.perf_counter()
                if ours is not None:
                    candle_ckpt.restart(params, fresh, verbose=False)
                else:
                    fresh.load_weights(directory)  # Keras reads its Orbax directory's newest step
                times_s.append(time.perf_counter() - start)
                names = [v.path for v in list(fresh.weights) + list(fresh.optimizer.variables)]
                differ |= {
                    name
                    for name, a, b in zip(names, trained, _values(fresh), strict=True)
                    if len(a) != len(b) or not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
                }
            result["restart_s"], result["restart_all_s"] = times_s[0], times_s
            result["restart_median_s"] = float(np.median(times_s))
            result["restored_equal"], result["restored_differ"] = not differ, sorted(differ)
        except Exception as err:  # a contender's restore that fails is recorded, not hidden
            result["restart_s"] = f"error: {type(err).__name__}: {err}"[:300]
    if rank == 0:
        result["epochs_s"] = [b - a for a, b in zip(times, times[1:] + [end], strict=True)]
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def run(contender: str, mib: int, epochs: int, timeout_s: float) -> dict:
    """Both processes of one contender's job; its figures."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{contender}-") as tmp:
        directory, out, port = os.path.join(tmp, "ck"), os.path.join(tmp, "out.json"), _free_port()
        env = dict(os.environ, KERAS_BACKEND="jax", JAX_NUM_CPU_DEVICES="2", TF_CPP_MIN_LOG_LEVEL="3")
        env["JAX_PLATFORMS"] = "cpu"  # 2 CPU devices per process, on a GPU host too
        args = ["--mib", str(mib), "--epochs", str(epochs), "--steps", str(STEPS), "--restarts", str(RESTARTS)]
        args.append("--child")
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
        ranks = []
        for rank in (0, 1):
            with open(f"{out}.{rank}") as f:
                ranks.append(json.load(f))
        result = ranks[0]
        if "blocked_by_hook_s" in result:  # both processes' blocked time, per save of the run (process 0's count)
            result["blocked"] = [blocked(r["blocked_by_hook_s"], result["saves"]) for r in ranks]
            result["blocked_by_hook_s"] = [r["blocked_by_hook_s"] for r in ranks]
            result["blocked_per_save_s"] = max(b["per_save_s"] for b in result["blocked"])
        if result["restored_equal"] is not None:
            result["restored_equal"] = all(r["restored_equal"] for r in ranks)
            result["restored_differ"] = sorted({name for r in ranks for name in r["restored_differ"]})
        newest, result["checkpoints"] = _newest(contender, directory)
        result["kept"] = len(result["checkpoints"])
        result["bytes_per_ckpt"] = _du(newest) if newest else 0
        result["bytes_on_disk"] = _du(directory)
        return result


def bench(mib: int, epochs: int, timeout_s: float) -> dict:
    """Every contender at ``mib`` MiB of state; the report of that size."""
    load_before = os.getloadavg()
    results = {c: run(c, mib, epochs, timeout_s) for c in CONTENDERS}
    base = results["none"]["epochs_s"][1:-1]
    report = {"mib": mib, "epochs": epochs, "steps_per_epoch": STEPS, "processes": 2, "devices_per_process": 2}
    report["load_average_before"] = load_before
    report["load_average_after"] = os.getloadavg()
    orbax = results["orbax"]
    for r in results.values():
        ends = r["epochs_s"][1:-1]
        r["stall_s"] = (sum(ends) / len(ends)) - (sum(base) / len(base))
        r["end_wait_s"] = r["epochs_s"][-1] - results["none"]["epochs_s"][-1]
        r["bytes_ratio"] = r["bytes_per_ckpt"] / r["state_bytes"] if r["bytes_per_ckpt"] else None
    for name in ("candle_sync", "candle_async"):
        r = results[name]
        r["stall_vs_orbax"] = r["stall_s"] / orbax["stall_s"] if orbax["stall_s"] > 0 else None
        r["blocked_vs_orbax"] = r["blocked_per_save_s"] / orbax["blocked_per_save_s"]
        both = isinstance(r["restart_s"], float) and isinstance(orbax["restart_s"], float) and orbax["restart_s"] > 0
        r["restart_vs_orbax"] = r["restart_s"] / orbax["restart_s"] if both else None
        if both:
            r["restart_median_vs_orbax"] = r["restart_median_s"] / orbax["restart_median_s"]
    report["contenders"] = results
    return report


def summary(report: dict) -> str:
    """One line per contender: stall, bytes and restart, against Orbax's."""
    lines = [f"{report['mib']} MiB of state, {report['epochs']} epochs:"]
    for name, r in report["contenders"].items():
        if name == "none":
            continue
        restart = f"{r['restart_s']:.3f} s" if isinstance(r["restart_s"], float) else str(r["restart_s"])
        if "restart_median_s" in r:
            restart += f" (median of {len(r['restart_all_s'])}: {r['restart_median_s']:.3f} s)"
        line = f"  {name:13s} stall {r['stall_s']:.3f} s"
        if "stall_vs_orbax" in r:
            line += f" ({r['stall_vs_orbax']:.2f}x Orbax's)" if r["stall_vs_orbax"] is not None else ""
        line += f", blocked in the hooks {r['blocked_per_save_s']:.3f} s a save"
        if "blocked_vs_orbax" in r:
            line += f" ({r['blocked_vs_orbax']:.2f}x Orbax's)"
        line += f", bytes {r['bytes_ratio']:.4f}x the state, restart {restart}"
        line += f" (restored bit for bit: {r['restored_equal']})"
        if "async_writer" in r:
            line += (
                f"; async writer {r['async_writer']}, snapshot {r['snapshot_s']:.3f} s, "
                f"wait for the previous write {r['writer_wait_s']:.3f} s, one commit {r['save_s']:.3f} s"
            )
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    global STEPS, RESTARTS  # noqa: PLW0603 (the children get them on their command line)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[256])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default=None, help="one JSON file (a single --mib only)")
    parser.add_argument("--out-dir", default=os.environ.get("OUT"), help="a JSON per size (default: $OUT)")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps per epoch (more: a longer epoch)")
    parser.add_argument("--restarts", type=int, default=RESTARTS, help="restarts timed per contender")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--child", nargs=5, default=None)
    args = parser.parse_args()
    STEPS, RESTARTS = args.steps, args.restarts
    if args.child:
        rank, port, contender, directory, out = args.child
        child(int(rank), int(port), contender, directory, args.mib[0], args.epochs, out)
        return
    if args.epochs < 3:
        parser.error("--epochs must be at least 3 (the first and the last epoch are not averaged)")
    if args.out and len(args.mib) > 1:
        parser.error("--out takes one size; use --out-dir for several")
    for mib in args.mib:
        report = bench(mib, args.epochs, args.timeout)
        text = json.dumps(report, indent=1)
        print(text)
        print(summary(report), file=sys.stderr)
        paths = [args.out] if args.out else []
        if args.out_dir:
            os.makedirs(args.out_dir, exist_ok=True)
            paths.append(os.path.join(args.out_dir, f"jax-multiprocess-{mib}.json"))
        for path in paths:
            with open(path, "w") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
