"""What grows with the number of processes: candle_ckpt at its defaults against Keras's ``OrbaxCheckpoint``.

Usage::

    python3 benchmarks/bench_scale.py [--n 1 2 4 8] [--steps 1000] [--base-steps 200] [--epoch-steps 40]
        [--stall-mib 256 | --no-stall] [--out-dir DIR]

For each N: N processes x 1 CPU device (gloo; N = 1 runs no ``jax.distributed``), DataParallel
(``auto_shard_dataset=False``, each process feeding its own rows, 8 a step), a 16-64-64-1 Dense model
with Adam. Every process runs, in one job:

1. ``fit`` without a checkpoint callback (``--base-steps`` steps);
2. ``restart()``, then ``fit`` with ``CandleCheckpointCallback`` at its defaults (``--steps`` steps, an
   epoch every ``--epoch-steps``: a checkpoint at each epoch end); then process 0 reads the keys under
   ``candle_ckpt/`` the coordination service holds (``key_value_dir_get``) after every process has met;
3. ``fit`` without the callback again (``--base-steps``);
4. ``fit`` with ``keras.callbacks.OrbaxCheckpoint`` at its defaults (``--base-steps``);
5. the restart of each: a fresh model (optimizer built) restores the newest checkpoint from a cold page
   cache, by ``restart()`` and by ``model.load_weights`` of the Orbax directory (the slowest process's
   time is reported).

A step's time is the gap between two consecutive ``on_train_batch_end`` calls of one epoch (an epoch's
end is left out); the median of each phase is reported, and ``ratio`` is the median with our callback
over the median without (phases 1 and 3 pooled). ``epoch_end_s`` is the median gap across an epoch
boundary less the median step: the stall of a checkpoint at the defaults (sync) on the training thread.
From the last checkpoint: files, each part's bytes (the largest writer's against the state) and the
primary's commit time (``stats()["saves"]``).

With ``--stall-mib`` (256 unless ``--no-stall``) it then runs ``bench_jax_multiprocess.py``'s 2-process
comparison with 40-step epochs at that size, against the targets of issue 37: our stall at the defaults at
most 0.5x Orbax's, our restart at most 1.0x Orbax's restore.

Prints a table; writes ``scale-<date>.json`` into ``--out-dir`` (default: ``$OUT`` if set). The machine's
load average is recorded: on a shared machine, ratios measured in one run are the comparable figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

FEATURES, HIDDEN, BATCH = 16, 64, 8
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"ratio": 1.05, "keys_per_process": 4, "stall_vs_orbax": 0.5, "restart_vs_orbax": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _model():
    import keras

    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    h = keras.layers.Dense(HIDDEN, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


def _step_clock(keras):
    """A callback recording ``(epoch, time)`` at every batch end."""

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.marks: list[tuple[int, float]] = []
            self.epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.marks.append((self.epoch, time.perf_counter()))

        def steps(self) -> list[float]:
            return [b - a for (e, a), (f, b) in zip(self.marks, self.marks[1:], strict=False) if e == f]

        def boundaries(self) -> list[float]:
            return [b - a for (e, a), (f, b) in zip(self.marks, self.marks[1:], strict=False) if e != f]

    return Clock()


def _cold(directory: str) -> None:
    """Write back, then drop from the page cache, every file under ``directory`` (a restart after a crash)."""
    os.sync()
    for root, _, files in os.walk(directory):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                fd = os.open(full, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def child(rank: int, n: int, port: int, tmp: str, steps: int, base: int, per_epoch: int) -> None:
    """One process of one job; writes its figures to ``tmp/out.<rank>.json``."""
    import jax

    if n > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{port}", n, rank)
    import keras
    import numpy as np

    import candle_ckpt
    from candle_ckpt.distributed.jax_group import coordination_client

    def meet(name: str) -> None:
        if n > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(name)

    keras.utils.set_random_seed(1)
    if n > 1:
        dist = keras.distribution.DataParallel(devices=keras.distribution.list_devices(), auto_shard_dataset=False)
        keras.distribution.set_distribution(dist)
    rng = np.random.default_rng(rank)  # each process its own rows
    x = rng.standard_normal((per_epoch * BATCH, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    ours_dir, orbax_dir = os.path.join(tmp, "ck"), os.path.join(tmp, "orbax")
    params = {"ckpt_directory": ours_dir, "epochs": max(1, steps // per_epoch)}
    out: dict = {"rank": rank, "phases": {}}

    def phase(name: str, epochs: int, callbacks: list) -> None:
        clock = _step_clock(keras)
        start = time.perf_counter()
        model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=epochs,
            shuffle=False,
            verbose=0,
            callbacks=[clock, *callbacks],
            validation_data=(x[:BATCH], y[:BATCH]),
        )  # val_loss: the callback's default best metric
        out["phases"][name] = {
            "wall_s": time.perf_counter() - start, "count": len(clock.marks), "steps": clock.steps(),
            "boundaries": clock.boundaries(),
        }  # fmt: skip

    model = _model()
    phase("without", max(1, base // per_epoch), [])
    candle_ckpt.restart(params, model, verbose=False)
    ours = candle_ckpt.CandleCheckpointCallback(params, verbose=False)
    phase("with", params["epochs"], [ours])
    meet("keys")
    client = coordination_client()
    if rank == 0:
        out["keys"] = len(client.key_value_dir_get("candle_ckpt/")) if client is not None else 0
    meet("keys-read")
    out["saves"] = [{k: r.get(k) for k in ("bytes", "snapshot_s", "save_s")} for r in ours.stats()["saves"]]
    phase("again", max(1, base // per_epoch), [])
    phase("orbax", max(1, base // per_epoch), [keras.callbacks.OrbaxCheckpoint(orbax_dir)])
    for name, directory in (("restart_s", ours_dir), ("orbax_restore_s", orbax_dir)):
        fresh = _model()
        fresh.optimizer.build(fresh.trainable_variables)  # fit builds it anyway: not a checkpoint's cost
        if rank == 0:
            _cold(directory)
        meet(name)
        start = time.perf_counter()
        if name == "restart_s":
            candle_ckpt.restart(params, fresh, verbose=False)
        else:
            fresh.load_weights(directory)
        out[name] = time.perf_counter() - start
        meet(name + "-done")
    state = list(model.weights) + list(model.optimizer.variables)
    out["state_bytes"] = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in state)
    with open(os.path.join(tmp, f"out.{rank}.json"), "w") as f:
        json.dump(out, f)


def _last_checkpoint(directory: str) -> dict:
    """Files, part sizes and the save's own figures of the newest checkpoint under ``directory``."""
    last = os.path.realpath(os.path.join(directory, "ckpts", "last"))
    files = sorted(os.listdir(last))
    manifest = os.path.join(last, "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            parts = [p["size"] for p in json.load(f)["parts"]]
    else:  # one process: model.keras
        parts = [os.path.getsize(os.path.join(last, "model.keras"))]
    return {"files": len(files), "part_bytes": parts, "checkpoint_bytes": sum(
        os.path.getsize(os.path.join(last, name)) for name in files
    )}  # fmt: skip


def run(n: int, steps: int, base: int, per_epoch: int, timeout_s: float) -> dict:
    """One job of ``n`` processes; its figures."""
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{n}-") as tmp:
        env = dict(os.environ, KERAS_BACKEND="jax", JAX_NUM_CPU_DEVICES="1", TF_CPP_MIN_LOG_LEVEL="3")
        env["JAX_PLATFORMS"] = "cpu"
        # This checkout's candle_ckpt (not another one installed): what is measured is what is here.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        port = _free_port()
        args = ["--child", str(n), str(port), tmp, "--steps", str(steps), "--base-steps", str(base)]
        args += ["--epoch-steps", str(per_epoch)]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *args, "--rank", str(rank)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for rank in range(n)
        ]
        start = time.monotonic()
        try:
            errs = [p.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - start)))[1] for p in procs]
        finally:
            for p in procs:  # one failure (or the timeout) ends every process of the job
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            bad = next(i for i, p in enumerate(procs) if p.returncode)
            raise RuntimeError(f"N={n}: process {bad} exited {procs[bad].returncode}: {errs[bad][-3000:]}")
        ranks = []
        for rank in range(n):
            with open(os.path.join(tmp, f"out.{rank}.json")) as f:
                ranks.append(json.load(f))
        return summarise(n, ranks, _last_checkpoint(os.path.join(tmp, "ck")))


def summarise(n: int, ranks: list[dict], last: dict) -> dict:
    """Medians over every process's steps per phase; the job's figures."""

    def pooled(*names: str, key: str = "steps") -> list[float]:
        return [s for r in ranks for name in names for s in r["phases"][name][key]]

    step = {"without": _median(pooled("without", "again")), "with": _median(pooled("with"))}
    step["orbax"] = _median(pooled("orbax"))
    ends = {name: _median(pooled(*names, key="boundaries")) for name, names in (
        ("without", ("without", "again")), ("with", ("with",)), ("orbax", ("orbax",))
    )}  # fmt: skip
    primary = ranks[0]
    state = primary["state_bytes"]
    saves = primary["saves"]
    return {
        "processes": n,
        "median_step_s": step,
        "ratio": step["with"] / step["without"] if step["without"] else None,
        "orbax_ratio": step["orbax"] / step["without"] if step["without"] else None,
        "epoch_end_s": {k: v - step[k] if v is not None and step[k] is not None else None for k, v in ends.items()},
        "steps_with_callback": primary["phases"]["with"]["count"],
        "keys_left": primary.get("keys", 0),
        "saves": len(saves),
        "commit_s": _median([s["save_s"] for s in saves if s.get("save_s") is not None]),
        "state_bytes": state,
        "files_per_checkpoint": last["files"],
        "part_bytes": last["part_bytes"],
        "largest_writer_bytes": max(last["part_bytes"]),
        "largest_writer_share": max(last["part_bytes"]) / state if state else None,
        "checkpoint_bytes": last["checkpoint_bytes"],
        "restart_s": max(r["restart_s"] for r in ranks),
        "orbax_restore_s": max(r["orbax_restore_s"] for r in ranks),
    }


def stall(mib: int, timeout_s: float) -> dict:
    """bench_jax_multiprocess's 2-process comparison at ``mib`` MiB with 40-step epochs (8 epochs)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_jax_multiprocess as mp  # noqa: PLC0415 (a sibling script)

    mp.STEPS = 40
    report = mp.bench(mib, 8, timeout_s)
    ours = report["contenders"]["candle_sync"]
    return {
        "mib": mib, "steps_per_epoch": 40, "report": report,
        "stall_vs_orbax": ours["stall_vs_orbax"], "restart_vs_orbax": ours["restart_vs_orbax"],
    }  # fmt: skip


def table(rows: list[dict], stalls: dict | None) -> str:
    """The printed report."""

    def ms(v):
        return f"{1000 * v:.2f}" if isinstance(v, float) else "-"

    head = (
        f"{'N':>3} {'step w/o ms':>11} {'with ms':>8} {'ratio':>6} {'Orbax ms':>9} {'keys left':>9} "
        f"{'files':>5} {'largest part B':>14} {'share':>6} {'commit ms':>9} {'end stall ms':>12} "
        f"{'restart ms':>10} {'Orbax restore ms':>16}"
    )
    lines = [head]
    for r in rows:
        s = r["median_step_s"]
        lines.append(
            f"{r['processes']:>3} {ms(s['without']):>11} {ms(s['with']):>8} {r['ratio']:>6.2f} {ms(s['orbax']):>9} "
            f"{r['keys_left']:>9} {r['files_per_checkpoint']:>5} {r['largest_writer_bytes']:>14} "
            f"{r['largest_writer_share']:>6.2f} {ms(r['commit_s']):>9} {ms(r['epoch_end_s']['with']):>12} "
            f"{ms(r['restart_s']):>10} {ms(r['orbax_restore_s']):>16}"
        )
    for r in rows:
        ok = [f"ratio {r['ratio']:.2f} {'<=' if r['ratio'] <= TARGETS['ratio'] else '>'} {TARGETS['ratio']}"]
        bound = TARGETS["keys_per_process"] * r["processes"]
        ok.append(f"keys {r['keys_left']} {'<=' if r['keys_left'] <= bound else '>'} 4N = {bound}")
        lines.append(f"targets at N={r['processes']}: " + ", ".join(ok))
    if stalls:
        for key in ("stall_vs_orbax", "restart_vs_orbax"):
            v, want = stalls[key], TARGETS[key]
            said = f"{v:.2f}x {'<=' if v <= want else '>'} {want}x" if isinstance(v, float) else str(v)
            lines.append(f"2 processes, {stalls['mib']} MiB, 40-step epochs: {key} {said}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=1000, help="steps with our callback (keys counted after)")
    parser.add_argument("--base-steps", type=int, default=200, help="steps of each other phase")
    parser.add_argument("--epoch-steps", type=int, default=40)
    parser.add_argument("--stall-mib", type=int, default=256)
    parser.add_argument("--no-stall", action="store_true", help="leave out the 2-process stall comparison")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    parser.add_argument("--out-dir", default=os.environ.get("OUT"))
    parser.add_argument("--child", nargs=3, default=None)
    parser.add_argument("--rank", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        n, port, tmp = args.child
        child(args.rank, int(n), int(port), tmp, args.steps, args.base_steps, args.epoch_steps)
        return
    if args.steps < 2 * args.epoch_steps:
        parser.error("--steps must be at least two epochs (--epoch-steps) so that a checkpoint follows another")
    report = {"date": datetime.date.today().isoformat(), "load_average_before": os.getloadavg(), "cpus": os.cpu_count()}
    path = os.path.join(args.out_dir, f"scale-{report['date']}.json") if args.out_dir else None
    rows = report["rows"] = []
    for n in args.n:  # each N's row is printed and written as soon as it is measured (a long run can be cut)
        rows.append(run(n, args.steps, args.base_steps, args.epoch_steps, args.timeout))
        print(table(rows[-1:], None).splitlines()[1], file=sys.stderr, flush=True)
        _write(path, report)
    report["stall"] = None if args.no_stall else stall(args.stall_mib, args.timeout)
    report["load_average_after"] = os.getloadavg()
    report["targets"] = TARGETS
    text = table(rows, report["stall"])
    print(text)
    if path:
        _write(path, report)
        print(f"wrote {path}")


def _write(path: str | None, report: dict) -> None:
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
