"""``restart()``: resume a job from its newest valid checkpoint.

:func:`select_checkpoint` is the shared half (also used by the epoch runner):
it pulls from ``ckpt_upload_url`` when the local directory is empty, picks the
checkpoint (``ckpt_restart_epoch`` or newest valid with fallback) and returns
its CRC-verified bytes. :func:`restart` then loads one model from them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from candle_ckpt import layout as L
from candle_ckpt.engine import note_resumed
from candle_ckpt.keras_state import ModelState
from candle_ckpt.oplog import OpsLog, get_logger
from candle_ckpt.params import CkptConfig
from candle_ckpt.sidecar import Sidecar
from candle_ckpt.store import CheckpointError, CheckpointStore, NoValidCheckpoint


def select_checkpoint(
    cfg: CkptConfig, ops: OpsLog, *, keep: Iterable[str], epoch: int | None = None, fs=None
) -> tuple[int, Sidecar, dict[str, bytes]] | None:
    """Find the checkpoint to resume from and return ``(epoch, sidecar, verified bytes)``.

    Args:
        cfg: The job's configuration (restart mode, directory, upload URL).
        ops: Where to log what was skipped and why.
        keep: Names of files whose verified bytes are returned.
        epoch: An exact epoch to restore (overrides ``cfg.restart_epoch``).
        fs: File-system operations for a pull from the remote store.

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
            side, kept = store.verify(wanted, keep=keep)
        except CheckpointError as err:
            raise NoValidCheckpoint(f"{what}: checkpoint is not valid: {err}") from None
        return wanted, side, kept

    problems: list[str] = []

    def report(bad_epoch: int, why: str) -> None:
        problems.append(f"epoch {bad_epoch}: {why}")
        ops.warning(f"restart: skipping epoch {bad_epoch}: {why}")

    found = store.find_valid(keep=keep, on_problem=report)
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


def restart(
    gParameters: Mapping[str, Any], model, logger: str | logging.Logger | None = "DEFAULT", verbose: bool = True
) -> dict[str, Any] | None:
    """Restore ``model`` (weights and optimizer state) from the newest valid checkpoint.

    ``ckpt_restart_mode``:

    * ``off``: return None and touch nothing.
    * ``auto``: resume from ``last``; if it is missing, dangling, fails its
      CRC or has a broken sidecar, log why and fall back to the newest valid
      checkpoint (by commit order). None if there is none.
    * ``required``: as auto, but raise :class:`NoValidCheckpoint` if none is valid.

    ``ckpt_restart_epoch`` restores exactly that epoch (a rollback) and raises
    :class:`NoValidCheckpoint` if it is missing or invalid.

    With ``ckpt_upload_url`` set and no checkpoint in the local directory (a
    new machine), the newest complete remote checkpoint is downloaded first,
    its CRCs verified, and committed locally.

    Every file's CRC is verified before anything is loaded into the model.

    Returns:
        The restored checkpoint's ``ckpt-info.json`` as a dict (``"epoch"`` is
        the number of completed epochs: pass it as ``initial_epoch``), or None.
    """
    cfg = CkptConfig.from_params(gParameters)
    if cfg.restart_mode == "off":
        return None
    ops = OpsLog(L.Layout.at(cfg.directory).log, get_logger(logger, verbose))
    start = time.perf_counter()
    found = select_checkpoint(cfg, ops, keep=(L.WEIGHTS_FILE, L.EXTRA_FILE))
    if found is None:
        return None
    epoch, side, kept = found
    verify_s = time.perf_counter() - start
    if side.model_file not in kept:
        raise NoValidCheckpoint(f"checkpoint {L.Layout.at(cfg.directory).epoch_dir(epoch)} has no {L.WEIGHTS_FILE}")
    start = time.perf_counter()
    state = ModelState(model)
    state.restore(kept[side.model_file])
    if L.EXTRA_FILE in kept:
        state.restore_extra(kept[L.EXTRA_FILE])
    elif state.extra_variables():
        ops.warning(
            f"restart: {L.Layout.at(cfg.directory).epoch_dir(epoch)} has no {L.EXTRA_FILE}; the random-layer seed "
            "states start fresh, so the resumed run will not be bit-identical"
        )
    record = load_record(side, verify_s, time.perf_counter() - start)
    note_resumed(cfg.directory, side, record)
    log_resumed(ops, cfg.directory, side, record)
    return side.to_dict()
