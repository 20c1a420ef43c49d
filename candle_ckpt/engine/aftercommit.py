"""What a save does besides the commit: its stats record and summary, the step checkpoints and
old epochs it retires, and a non-chief worker's scratch copy in place of a commit.

Module-level functions over the store and the log, so the epoch save
(:class:`~candle_ckpt.engine.engine.CheckpointEngine`) and the step save
(:meth:`~candle_ckpt.engine.engine.CheckpointEngine.save_step`) share them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.log import OpsLog, counted, human_bytes, mb_per_s, position
from candle_ckpt.core.policy import BestState
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.capture import Capture
from candle_ckpt.storage.store import CheckpointStore


def save_record(what: dict[str, Any], cap: Capture, side: Sidecar) -> dict[str, Any]:
    """The ``stats()["saves"]`` record of one commit: ``what`` (epoch, step, reason), then bytes and timings.

    ``mb_per_s`` is the store's write speed (the snapshot is not part of it).
    """
    return {
        **what,
        "bytes": side.total_bytes,
        "snapshot_s": round(cap.snapshot_s, 6),
        "save_s": side.save_duration_s,
        "mb_per_s": side.save_mb_per_s,
    }


def saved_line(what: dict[str, Any], side: Sidecar) -> str:
    """The ``ckpt.log`` line of a commit (``what``: its epoch, a step checkpoint's step, the reason)."""
    step = what.get("step")
    name = L.epoch_name(what["epoch"]) if step is None else L.step_name(side.generation)
    return (
        f"{position(what['epoch'], step)}: saved {name} ({what['reason']}) {human_bytes(side.total_bytes)} "
        f"in {side.save_duration_s:.3f} s ({side.save_mb_per_s:.1f} MB/s)"
    )


def part_record(what: dict[str, Any], cap: Capture, start: float) -> dict[str, Any]:
    """The ``stats()["saves"]`` record of a non-primary's part of a multi-process commit that began at ``start``
    (``time.perf_counter()``): ``part`` is True, ``bytes`` the state it wrote (its slices and its training state)."""
    elapsed = time.perf_counter() - start
    return {
        **what,
        "bytes": cap.nbytes,
        "snapshot_s": round(cap.snapshot_s, 6),
        "save_s": round(elapsed, 6),
        "mb_per_s": mb_per_s(cap.nbytes, elapsed),
        "part": True,
    }


def supersede_steps(store: CheckpointStore, log: OpsLog, epoch: int) -> None:
    """After the commit of epoch ``epoch``: remove the step checkpoints of earlier epochs, and say so."""
    try:
        superseded = store.steps.supersede(epoch)
    except OSError as err:  # this commit is durable; a leftover step checkpoint is older than it
        log.warning(f"could not remove the superseded step checkpoints: {err}")
        return
    if superseded:
        log.info(f"removed step checkpoint {', '.join(L.step_name(g) for g in superseded)}")


def prune_after_commit(
    store: CheckpointStore, cfg: CkptConfig, log: OpsLog, retention: Any, protected: list[int]
) -> None:
    """Apply the retention policy (best, last and ``protected`` are kept) and log what went."""
    deleted = store.prune(retention.select, protected)
    if deleted:
        log.info(
            f"pruned epochs {', '.join(L.epoch_name(e) for e in deleted)} "
            f"(keep_mode {cfg.keep_mode}, keep_limit {cfg.keep_limit})"
        )


def write_scratch(fs: Any, tmp: str, epoch: int, cap: Capture, log: OpsLog) -> None:
    """A non-chief's save: write the files into its scratch directory ``tmp``, then remove it.

    Never raises for a failed write: a worker's scratch copy failing must not stop the cluster.
    """
    try:
        if os.path.lexists(tmp):
            fs.rmtree(tmp)
        fs.makedirs(tmp)
        for spec in cap.files:
            f = fs.create(os.path.join(tmp, spec.name))
            try:
                spec.write(f)
            finally:
                f.abort()  # closed without fsync: the copy is deleted at once
    except Exception as err:
        log.warning(
            f"epoch {epoch}: temporary save in {tmp} failed: {type(err).__name__}: {err} "
            "(the chief's checkpoints are unaffected)"
        )
    finally:
        if os.path.lexists(tmp):
            fs.rmtree(tmp)


def report_summary(records: list[dict[str, Any]], best: BestState, errors: list[str]) -> str:
    """The one-line summary of a run's checkpoints (CANDLE's ``report_final``)."""
    if not records:
        return "report: no checkpoints were written in this run"
    if all(r.get("part") for r in records):  # a non-primary of a multi-process job: what this process wrote
        total = sum(r["bytes"] for r in records)
        return (
            f"report: wrote its part ({human_bytes(total)} in all) of {len(records)} checkpoints committed by "
            f"process 0; last epoch {records[-1]['epoch']}; errors {len(errors)}"
        )
    total = sum(r["bytes"] for r in records)
    secs = sum(r["save_s"] for r in records)
    return (
        f"report: {counted(len(records), 'checkpoint')}, {human_bytes(total)} in {secs:.2f} s "
        f"({total / max(secs, 1e-9) / 1e6:.1f} MB/s); last epoch {records[-1]['epoch']}; "
        f"best {best.metric}={best.value} at epoch {best.epoch}; errors {len(errors)}"
    )
