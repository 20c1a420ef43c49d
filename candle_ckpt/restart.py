"""``restart()``: resume a job from its newest valid checkpoint."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from candle_ckpt import layout as L
from candle_ckpt.engine import note_resumed
from candle_ckpt.keras_state import ModelState
from candle_ckpt.oplog import OpsLog, get_logger
from candle_ckpt.params import CkptConfig
from candle_ckpt.store import CheckpointError, CheckpointStore, NoValidCheckpoint


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

    Every file's CRC is verified before anything is loaded into the model.

    Returns:
        The restored checkpoint's ``ckpt-info.json`` as a dict (``"epoch"`` is
        the number of completed epochs: pass it as ``initial_epoch``), or None.
    """
    cfg = CkptConfig.from_params(gParameters)
    if cfg.restart_mode == "off":
        return None
    store = CheckpointStore(cfg.directory, checksum=cfg.checksum)
    ops = OpsLog(store.layout.log, get_logger(logger, verbose))
    where = store.layout.root
    if not store.exists():
        note_resumed(cfg.directory, None)
        if cfg.restart_mode == "required" or cfg.restart_epoch is not None:
            raise NoValidCheckpoint(f"ckpt_restart_mode={cfg.restart_mode}: no checkpoints in {where}")
        if os.path.isdir(where):
            ops.info(f"restart: no checkpoints in {where}; starting from scratch")
        return None

    keep = (L.WEIGHTS_FILE, L.EXTRA_FILE)
    if cfg.restart_epoch is not None:
        if cfg.restart_epoch not in store.epochs():
            raise NoValidCheckpoint(
                f"ckpt_restart_epoch={cfg.restart_epoch}: no checkpoint {store.layout.epoch_dir(cfg.restart_epoch)}"
            )
        try:
            side, kept = store.verify(cfg.restart_epoch, keep=keep, mapped=True)
        except CheckpointError as err:
            raise NoValidCheckpoint(f"ckpt_restart_epoch={cfg.restart_epoch}: checkpoint is not valid: {err}") from None
        epoch = cfg.restart_epoch
    else:
        problems: list[str] = []

        def report(bad_epoch: int, why: str) -> None:
            problems.append(f"epoch {bad_epoch}: {why}")
            ops.warning(f"restart: skipping epoch {bad_epoch}: {why}")

        found = store.find_valid(keep=keep, on_problem=report, mapped=True)
        if found is None:
            note_resumed(cfg.directory, None)
            detail = "; ".join(problems) or "none were found"
            if cfg.restart_mode == "required":
                raise NoValidCheckpoint(f"ckpt_restart_mode=required: no valid checkpoint in {where} ({detail})")
            ops.warning(f"restart: no valid checkpoint in {where} ({detail}); starting from scratch")
            return None
        epoch, side, kept = found
    if side.model_file not in kept:
        raise NoValidCheckpoint(f"checkpoint {store.layout.epoch_dir(epoch)} has no {L.WEIGHTS_FILE}")
    state = ModelState(model)
    try:
        state.restore(kept[side.model_file])
        if L.EXTRA_FILE in kept:
            state.restore_extra(bytes(kept[L.EXTRA_FILE]))
        elif state.extra_variables():
            ops.warning(
                f"restart: {store.layout.epoch_dir(epoch)} has no {L.EXTRA_FILE}; the random-layer seed states "
                "start fresh, so the resumed run will not be bit-identical"
            )
    finally:
        for data in kept.values():
            if hasattr(data, "close"):
                data.close()  # unmap now rather than at garbage collection
    note_resumed(cfg.directory, side)
    ops.info(f"restart: resumed from {store.layout.epoch_dir(epoch)} (epoch {epoch}, generation {side.generation})")
    return side.to_dict()
