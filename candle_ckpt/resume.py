"""Choose, fetch and verify the checkpoint a job resumes from (no Keras here).

Shared by ``restart()`` (one model, ``keras_restart.py``) and the epoch runner
(several objects and loop state).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from candle_ckpt import layout as L
from candle_ckpt.engine import note_resumed
from candle_ckpt.oplog import OpsLog
from candle_ckpt.params import CkptConfig
from candle_ckpt.sidecar import Sidecar
from candle_ckpt.store import CheckpointError, CheckpointStore, NoValidCheckpoint


def select_checkpoint(
    cfg: CkptConfig,
    ops: OpsLog,
    *,
    keep: Iterable[str],
    epoch: int | None = None,
    fs=None,
    mapped: bool = False,
) -> tuple[int, Sidecar, dict[str, Any]] | None:
    """Find the checkpoint to resume from and return ``(epoch, sidecar, verified bytes)``.

    Args:
        cfg: The job's configuration (restart mode, directory, upload URL).
        ops: Where to log what was skipped and why.
        keep: Names of files whose verified bytes are returned.
        epoch: An exact epoch to restore (overrides ``cfg.restart_epoch``).
        fs: File-system operations for a pull from the remote store.
        mapped: Return kept files as read-only mmaps (see ``CheckpointStore.verify``).

    Returns:
        None when there is nothing to resume from (and the mode allows it).

    Raises:
        NoValidCheckpoint: ``required`` mode or an exact epoch, and no valid checkpoint.
    """
    if cfg.restart_mode == "off" and epoch is None:
        return None
    store = CheckpointStore(cfg.directory, fs=fs, checksum=cfg.checksum)
    where = store.layout.root
    wanted = epoch if epoch is not None else cfg.restart_epoch
    what = f"resume_from_epoch={epoch}" if epoch is not None else f"ckpt_restart_epoch={cfg.restart_epoch}"
    if cfg.upload_url and not store.epochs():
        from candle_ckpt.remote import pull_newest

        pull_newest(cfg, store, ops, epoch=wanted)
    if not store.exists():
        note_resumed(cfg.directory, None)
        if cfg.restart_mode == "required" or wanted is not None:
            mode = f"ckpt_restart_mode={cfg.restart_mode}" if wanted is None else what
            raise NoValidCheckpoint(f"{mode}: no checkpoints in {where}")
        if os.path.isdir(where):
            ops.info(f"restart: no checkpoints in {where}; starting from scratch")
        return None
    keep = tuple(keep)
    if wanted is not None:
        if wanted not in store.epochs():
            raise NoValidCheckpoint(f"{what}: no checkpoint {store.layout.epoch_dir(wanted)}")
        try:
            side, kept = store.verify(wanted, keep=keep, mapped=mapped)
        except CheckpointError as err:
            raise NoValidCheckpoint(f"{what}: checkpoint is not valid: {err}") from None
        return wanted, side, kept

    problems: list[str] = []

    def report(bad_epoch: int, why: str) -> None:
        problems.append(f"epoch {bad_epoch}: {why}")
        ops.warning(f"restart: skipping epoch {bad_epoch}: {why}")

    found = store.find_valid(keep=keep, on_problem=report, mapped=mapped)
    if found is None:
        note_resumed(cfg.directory, None)
        detail = "; ".join(problems) or "none were found"
        if cfg.restart_mode == "required":
            raise NoValidCheckpoint(f"ckpt_restart_mode=required: no valid checkpoint in {where} ({detail})")
        ops.warning(f"restart: no valid checkpoint in {where} ({detail}); starting from scratch")
        return None
    return found


def load_record(side: Sidecar, verify_s: float, load_s: float) -> dict[str, Any]:
    """The statistics of one restore: bytes, read+verify and load durations, MB/s."""
    total = max(verify_s + load_s, 1e-9)
    return {
        "epoch": side.epoch,
        "bytes": side.total_bytes,
        "verify_s": round(verify_s, 6),
        "load_s": round(load_s, 6),
        "mb_per_s": round(side.total_bytes / total / 1e6, 3),
    }


def log_resumed(ops: OpsLog, directory: str, side: Sidecar, record: dict[str, Any]) -> None:
    path = L.Layout.at(directory).epoch_dir(side.epoch)
    ops.info(
        f"restart: resumed from {path} (epoch {side.epoch}, generation {side.generation}); "
        f"{record['bytes'] / 1e6:.1f} MB read and verified in {record['verify_s']:.3f} s, "
        f"loaded in {record['load_s']:.3f} s ({record['mb_per_s']:.1f} MB/s)"
    )
