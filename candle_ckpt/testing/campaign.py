"""Synthetic campaign runs for ``candle-ckpt campaign``'s tests and benchmark: persistent directories whose
sidecars and restart histories are written by the project's own code (:class:`Sidecar`, :mod:`history`),
with the times, reasons and records of each state, so that a state can be set up without training for hours.

Each run is a persistent directory (docs/campaigns.rst)::

    <root>/<run>/epochs/NNN/{ckpt.tar, ckpt-info.json}   the newest ``keep`` epochs
    <root>/<run>/steps/GGG/{ckpt.tar, ckpt-info.json}    a preemption save (state "preempted")
    <root>/<run>/restarts.jsonl                          one record per restart (and failure, refusal)
"""

from __future__ import annotations

import os
import time
from typing import Any

from candle_ckpt.core import history as H
from candle_ckpt.core import layout as L
from candle_ckpt.core.sidecar import FileEntry, Sidecar

PER_EPOCH_S = 20.0
EPOCHS = 10
ARCHIVE_BYTES = 10240  # a stand-in for ckpt.tar: never read by the campaign view


def stamp(t: float) -> str:
    """A sidecar's ``timestamp`` for Unix time ``t`` (the engine's format)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def sidecar(epoch: int, when: float, *, step: int | None = None, generation: int | None = None, **fields: Any):
    """A realistic sidecar of ``epoch`` committed at ``when`` (val_loss monitored, min mode, limit ``EPOCHS``)."""
    best = fields.pop("best", 1.0 / (1 + epoch))
    extra = {
        "archive": {"name": "ckpt.tar", "size": ARCHIVE_BYTES, "crc32": "00000000"},
        "io": {"last_upload": {"lag_s": 0.25, "generation": max(epoch - 1, 0), "bytes": 42332}},
        "epochs": fields.pop("limit", EPOCHS),
    }
    return Sidecar(
        epoch=epoch,
        generation=generation if generation is not None else epoch,
        model_file="model.keras",
        files={"model.keras": FileEntry(22978, "709791d0"), "train.state.npz": FileEntry(9994, "5facd68e")},
        save_best_metric="val_loss",
        best_metric_last=best,
        best_epoch=fields.pop("best_epoch", epoch),
        save_best_mode="min",
        timestamp=stamp(when),
        time_elapsed=fields.pop("time_elapsed", epoch * PER_EPOCH_S),
        logs={"loss": best * 0.9, "val_loss": best},
        reason=fields.pop("reason", "best"),
        keras_version="3.15.1",
        backend="tensorflow",
        extra=extra,
        step=step,
        lineage=fields.pop("lineage", "045898d52a7440a3"),
        **fields,
    )


def put(run_dir: str, side: Sidecar, *, sidecar_too: bool = True) -> str:
    """Write ``side`` as a persistent checkpoint of ``run_dir`` (the archive, then the sidecar)."""
    kind, number = ("epoch", side.epoch) if side.step is None else ("step", side.generation)
    where = os.path.join(run_dir, *L.checkpoint_name(kind, number).split("/"))
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "ckpt.tar"), "wb") as f:
        f.write(b"\0" * ARCHIVE_BYTES)
    if sidecar_too:
        with open(os.path.join(where, L.SIDECAR), "wb") as f:
            f.write(side.to_json())
    return where


def record(path: str, event: str, when: float, host: str, **fields: Any) -> None:
    """Append a history record of ``event`` at ``when`` on ``host`` (``history.new_record``, then restamped)."""
    rec = H.new_record(event, **fields)
    rec.update(time=round(when, 3), host=host)
    H.append_local(path, rec)


def write_run(root: str, run: str, state: str, now: float, *, keep: int = 2, epochs: int = 6) -> str:
    """A persistent run directory in ``state`` (one of ``campaign_state.STATES``) as of ``now``; its path.

    The run trained ``epochs`` epochs (``EPOCHS`` for "done") at ``PER_EPOCH_S`` a piece; its newest commit
    is a few seconds old, except a stale run's (an hour old); moved and refused runs restarted on two hosts.
    """
    run_dir = os.path.join(root, run)
    done = EPOCHS if state == "done" else epochs
    end = now - (3600.0 if state == "stale" else 5.0)
    start = end - done * PER_EPOCH_S
    for epoch in range(max(done - keep + 1, 1), done + 1):
        put(run_dir, sidecar(epoch, start + epoch * PER_EPOCH_S))
    hist = os.path.join(run_dir, H.HISTORY_FILE)
    record(hist, "restart", start - 1.0, "node-a", resumed=None, epoch=0, generation=0)
    if state in ("moved", "refused", "failed"):
        record(hist, "restart", start + 2.5 * PER_EPOCH_S, "node-b", resumed=L.link_target(2), epoch=2, generation=2)
    if state == "preempted":
        put(run_dir, sidecar(done, end + 3.0, step=7, generation=done + 1, reason="SIGTERM"))
    if state == "failed":
        record(hist, "failure", end + 1.0, "node-b", error="ValueError: loss is nan", phase="step")
    if state == "refused":
        resumed = L.link_target(done)
        record(hist, "refused", end + 2.0, "node-b", resumed=resumed, count=3, last_failure="ValueError: nan")
    return run_dir


def half_written(run_dir: str, epoch: int, when: float) -> None:
    """A checkpoint being drained (its archive there, no sidecar yet) and a history line cut by a kill."""
    put(run_dir, sidecar(epoch, when), sidecar_too=False)
    with open(os.path.join(run_dir, H.HISTORY_FILE), "ab") as f:
        f.write(b'{"v":1,"event":"restart","ti')
