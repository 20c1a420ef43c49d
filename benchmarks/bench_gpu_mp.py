"""A 2-process JAX save on an accelerator: the stall of candle_ckpt's multi-process save, sync and async.

Run on a machine with a GPU (or on CPU as a dry run, each process one CPU device)::

    KERAS_BACKEND=jax python benchmarks/bench_gpu_mp.py --state-mib 256 --out results/gpu-mp.json

Starts 2 processes of this script (``jax.distributed`` on localhost, each process one local
device; on a one-GPU machine both share it, each allowed 40% of its memory). Each runs the same
``fit``: ``DataParallel(auto_shard_dataset=False)``, its own rows, ``Dense`` layers trained with
Adam (about ``--state-mib`` of state), a simulated compute phase per epoch, and in turn no
callback, ``CandleCheckpointCallback`` at its defaults (sync) and with ``ckpt_async``. The
stall is the training thread's wait in the engine's save (``bench_lib.Timed``), a median over
the epochs after the first. It prints one table and writes JSON (``--out``) with every
process's figures and the bytes each wrote per checkpoint.
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

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def child(args: argparse.Namespace) -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    sys.path.insert(0, HERE)
    import jax  # noqa: PLC0415

    jax.distributed.initialize(f"localhost:{args.port}", 2, args.rank)
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from bench_lib import LAYER_MIB, Compute, Timed, median  # noqa: PLC0415

    from candle_ckpt import CandleCheckpointCallback, restart  # noqa: PLC0415

    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=keras.distribution.list_devices(), auto_shard_dataset=False)
    )
    keras.utils.set_random_seed(0)
    layers = max(1, round(args.state_mib / LAYER_MIB))
    model = keras.Sequential([keras.Input((2048,))] + [keras.layers.Dense(2048) for _ in range(layers)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    local_batch = 4
    x = np.random.default_rng(args.rank).random((args.steps * local_batch, 2048), dtype=np.float32)
    out = {"rank": args.rank, "device": str(jax.local_devices()[0]), "layers": layers}
    for name in ("none", "candle_ckpt sync", "candle_ckpt async"):
        cb, directory = None, os.path.join(args.work, name.replace(" ", "-"))
        if name != "none":
            params = {"ckpt_directory": directory, "epochs": args.epochs, "ckpt_save_best_metric": "loss"}
            if name.endswith("async"):
                params["ckpt_async"] = True
            restart(params, model, logger=None, verbose=False)
            cb = CandleCheckpointCallback(params, logger=None, verbose=False)
        clock = Compute(args.compute_s)
        timed = Timed(cb) if cb is not None else None
        try:
            model.fit(x, x, batch_size=local_batch, epochs=args.epochs, shuffle=True, verbose=0,
                      callbacks=[clock] + ([cb] if cb else []))  # fmt: skip
        except Exception as err:  # reported, e.g. collectives across two processes on one GPU
            out[name] = {"error": f"{type(err).__name__}: {err}"[:500]}
            break
        row = {"epoch_wall_s": median(clock.epoch_wall()[1:])}
        if timed is not None:
            row.update(stall_s=median(timed.epoch_end_s[1:]), stalls=timed.epoch_end_s, train_end_s=timed.train_end_s)
            last = os.path.join(directory, "ckpts", "last")
            row["files"] = sorted(os.listdir(last)) if os.path.isdir(last) else []
            row["bytes_by_file"] = {f: os.path.getsize(os.path.join(last, f)) for f in row["files"]}
        out[name] = row
    print("RESULT " + json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-mib", type=float, default=256.0)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--compute-s", type=float, default=1.0)
    ap.add_argument("--timeout-s", type=float, default=400.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank is not None:
        child(args)
        return 0
    port, results = free_port(), []
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_NUM_CPU_DEVICES="1", PYTHONUNBUFFERED="1")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.4")  # two processes on one GPU
    with tempfile.TemporaryDirectory() as work:
        base = [sys.executable, __file__, f"--state-mib={args.state_mib}", f"--epochs={args.epochs}"]
        base += [f"--steps={args.steps}", f"--compute-s={args.compute_s}", f"--port={port}", f"--work={work}"]
        procs = [
            subprocess.Popen(
                [*base, f"--rank={r}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for r in range(2)
        ]
        deadline = time.monotonic() + args.timeout_s
        for p in procs:
            try:
                text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                text, _ = p.communicate()
            lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
            results.append(json.loads(lines[-1][7:]) if lines else {"exit": p.returncode, "tail": text[-3000:]})
    for r in results:
        print(f"process {r.get('rank', '?')} on {r.get('device', '?')}:")
        if "tail" in r:
            print(r["tail"])
            continue
        for name in ("none", "candle_ckpt sync", "candle_ckpt async"):
            row = r.get(name, {})
            if "error" in row:
                print(f"  {name:18s} ERROR {row['error']}")
            elif "stall_s" in row:
                wrote = sum(row["bytes_by_file"].values()) / 2**20
                print(f"  {name:18s} stall {row['stall_s'] * 1e3:8.1f} ms  epoch {row['epoch_wall_s']:.2f} s  "
                      f"last/ holds {wrote:.1f} MiB in {len(row['files'])} files")  # fmt: skip
            elif row:
                print(f"  {name:18s} epoch {row['epoch_wall_s']:.2f} s")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all("tail" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
