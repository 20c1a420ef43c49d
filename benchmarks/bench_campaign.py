"""A campaign on one machine: node-local fast tiers draining to a shared directory, against writing straight to it.

::

    python benchmarks/bench_campaign.py --runs 32 --kills 3 --epochs 10 --out benchmarks/results/campaign.json

Runs the campaign of ``tests/integration/storage/test_campaign.py`` twice (README.rst's Quickstart model,
``--runs`` concurrent runs forked by one server that imported Keras once, each SIGKILLed ``--kills`` times at
random moments):

* **tiers**: each life's ``ckpt_directory`` is a new, empty directory under ``/dev/shm`` (a RAM disk, as on a
  node), ``ckpt_persistent_url`` is ``shared/run-NN``: every restart pulls from the shared directory;
* **direct**: ``ckpt_directory`` is ``shared/run-NN`` itself, no persistent tier (what campaigns do today when
  they checkpoint at all).

Reports, for each: the files and bytes in the shared directory at the end; the training thread's time per
epoch in the checkpoint callback (the stall: the save, plus the drain's staging with tiers); the drain's lag
behind the fast tier's commit (tiers only); the campaign's wall time. Then the file-system operations one
checkpoint costs the shared directory, counted in this process on one Quickstart save (the fast tier's seam
counted with a ``LocalFS`` hook, the persistent tier's by the drain). Prints a table and writes JSON.

On one machine the "shared directory" is a local disk, not a parallel file system: the counts (files,
metadata operations, fsyncs per checkpoint) carry over to a PFS, the times do not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "integration" / "jobs"), str(HERE.parent)]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {
        "n": len(xs),
        "median": round(statistics.median(xs), 6),
        "p95": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 6),
        "max": round(xs[-1], 6),
    }


def tree(root: Path) -> dict[str, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def campaign(args, direct: bool, work: Path) -> dict:
    from campaign_job import Campaign

    fast_root = Path(tempfile.mkdtemp(prefix="campaign-fast-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    c = Campaign(work, args.runs, args.kills, args.epochs, direct=direct, seeds=args.seeds, rng_seed=args.seed)
    if not direct:
        (work / "fast").symlink_to(fast_root, target_is_directory=True)
    c.start_server(600)
    try:
        wall = c.play(silence_s=600, twins=False)
    finally:
        c.close()
        shutil.rmtree(fast_root, ignore_errors=True)
    stalls, lags, drains = [], [], []
    for run in c.runs:
        figures = json.loads(Path(c.out(run) + ".json").read_text())
        stalls += figures["stall_s"]
        lags += [u["lag_s"] for u in figures["uploads"] if u.get("lag_s") is not None]
        drains += [u["upload_s"] for u in figures["uploads"]]
    behind = sum(
        1
        for run in c.runs
        for held, got in zip(run.at_kill, run.resumes[1:], strict=False)
        if held is not None and (got is None or got < held)
    )
    return {
        "wall_s": round(wall, 3),
        "lives": sum(len(run.statuses) for run in c.runs),
        "kills": sum(len(run.at_kill) for run in c.runs),
        "restarts_behind_the_shared_directory": behind,
        "shared": tree(work / "shared"),
        "stall_s_per_epoch": quantiles(stalls),
        "drain_lag_s": quantiles(lags),
        "drain_s": quantiles(drains),
    }


def ops_per_checkpoint(work: Path) -> dict:
    """The shared directory's operations for one Quickstart checkpoint (the second save of a run): direct
    (the fast tier's commit protocol on it) and tiers (the drain's two files)."""
    return {mode: _ops_of(mode, work) for mode in ("direct", "tiers")}


def _ops_of(mode: str, work: Path) -> dict:
    import keras
    import numpy as np

    import candle_ckpt
    from candle_ckpt.core.fs import LocalFS

    class Counting(LocalFS):
        def __init__(self) -> None:
            self.ops: Counter[str] = Counter()

        def hook(self, op: str, path: str) -> None:
            self.ops[op] += 1

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = x @ rng.normal(size=(8, 1)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    gp = {"epochs": 2, "ckpt_directory": str(work / f"ops-{mode}")}
    if mode == "tiers":
        gp["ckpt_persistent_url"] = str(work / f"ops-{mode}-shared")
    cb = candle_ckpt.CandleCheckpointCallback(gp, logger=None)
    fs = Counting()
    cb.engine.store.fs = fs
    first: dict[str, int] = {}

    class Mark(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                first.update(fs.ops)

    model.fit(x, y, validation_split=0.25, epochs=2, callbacks=[Mark(), cb], verbose=0)
    cb.report_final()
    fast = {k: v - first.get(k, 0) for k, v in fs.ops.items() if v - first.get(k, 0)}
    if mode == "direct":
        return {
            "files_created": fast.get("create", 0),
            "fsyncs": fast.get("fsync", 0) + fast.get("fsync_dir", 0),
            "metadata_ops": sum(fast.get(k, 0) for k in ("mkdir", "rename", "replace", "symlink", "unlink")),
            "detail": fast,
        }
    ops = cb.stats()["uploads"][-1]["ops"]
    return {**{k: ops.get(k, 0) for k in ("files_created", "fsyncs", "metadata_ops")}, "fast_tier": fast}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="the kill moments' random seed")
    parser.add_argument("--backend", default="tensorflow")
    parser.add_argument("--out", default=str(HERE / "results" / f"campaign-{time.strftime('%Y-%m-%d')}.json"))
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = args.backend
    report = {
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("tiers", "direct"):
            work = Path(tmp) / mode
            work.mkdir()
            report[mode] = campaign(args, mode == "direct", work)
        report["ops_per_checkpoint"] = ops_per_checkpoint(Path(tmp))
    print(f"{args.runs} runs x {args.kills} SIGKILLs, {args.epochs} epochs, backend {args.backend}")
    print(f"{'':24}{'tiers':>14}{'direct':>14}")
    t, d = report["tiers"], report["direct"]
    rows = [
        ("shared files", t["shared"]["files"], d["shared"]["files"]),
        ("shared bytes", t["shared"]["bytes"], d["shared"]["bytes"]),
        ("stall/epoch median s", t["stall_s_per_epoch"]["median"], d["stall_s_per_epoch"]["median"]),
        ("stall/epoch p95 s", t["stall_s_per_epoch"]["p95"], d["stall_s_per_epoch"]["p95"]),
        ("drain lag median s", t["drain_lag_s"].get("median", "-"), "-"),
        ("drain lag max s", t["drain_lag_s"].get("max", "-"), "-"),
        ("restarts behind shared", t["restarts_behind_the_shared_directory"], "-"),
        ("wall s", t["wall_s"], d["wall_s"]),
    ]
    for name, a, b in rows:
        print(f"{name:24}{a!s:>14}{b!s:>14}")
    ops = report["ops_per_checkpoint"]
    for mode in ("tiers", "direct"):
        o = ops[mode]
        print(
            f"per checkpoint on the shared directory ({mode}): {o['files_created']} files created, "
            f"{o['fsyncs']} fsyncs, {o['metadata_ops']} metadata operations"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
