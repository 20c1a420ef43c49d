"""Opt-in part of the benchmark (``--retained N``): save and restart with N checkpoints retained.

The retained checkpoints are made cheaply: every ``epochs/NNN`` holds hard
links to one real checkpoint's files and its own valid sidecar, so the store
sees N committed, verifiable checkpoints without N copies of the data.
Imported by ``bench_checkpoint.py`` (run that one).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time

from bench_lib import run_fit

from candle_ckpt import CandleCheckpointCallback
from candle_ckpt.core import layout as L
from candle_ckpt.storage.store import CheckpointStore


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


def retained(model, x, workdir: str, source: str, counts: list[int], epochs: int, restart_time) -> dict:
    """Open, save and restart times (defaults) with each of ``counts`` checkpoints retained.

    Every directory stays until all counts are done, so each run's saves write
    into fresh disk blocks. ``restart_time(directory)`` times one restart.
    """
    out, made = {}, []
    for count in counts:
        d = os.path.join(workdir, f"retained-{count}")
        make_retained(d, source, count)
        params = {"ckpt_directory": d, "epochs": count + epochs, "ckpt_save_best_metric": "loss"}
        start = time.perf_counter()
        cb = CandleCheckpointCallback(params, logger=None, verbose=False)
        open_s = time.perf_counter() - start
        fit = run_fit(model, x, epochs, 0.0, cb, initial_epoch=count)
        cb.close()  # fit has released the writer lock already; this only makes sure
        out[str(count)] = {"open_s": open_s, "save_stall_s": fit["stall_s"], "restart_s": restart_time(d)}
        made.append(d)
    for d in made:
        shutil.rmtree(d)
    return out
