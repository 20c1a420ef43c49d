"""``restart()``: resume a job from its newest valid checkpoint.

The shared half (remote pull, choice of the checkpoint, CRC verification) is
:func:`candle_ckpt.resume.select_checkpoint`, also used by the epoch runner;
this module loads one model from what it returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from candle_ckpt import layout as L
from candle_ckpt.engine import note_resumed
from candle_ckpt.keras_state import ModelState
from candle_ckpt.oplog import OpsLog, get_logger
from candle_ckpt.params import CkptConfig
from candle_ckpt.resume import load_record, log_resumed, select_checkpoint
from candle_ckpt.store import NoValidCheckpoint


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
    found = select_checkpoint(cfg, ops, keep=(L.WEIGHTS_FILE, L.EXTRA_FILE), mapped=True)
    if found is None:
        return None
    epoch, side, kept = found
    verify_s = time.perf_counter() - start
    if side.model_file not in kept:
        raise NoValidCheckpoint(f"checkpoint {L.Layout.at(cfg.directory).epoch_dir(epoch)} has no {L.WEIGHTS_FILE}")
    start = time.perf_counter()
    state = ModelState(model)
    try:
        state.restore(kept[side.model_file])
        if L.EXTRA_FILE in kept:
            state.restore_extra(bytes(kept[L.EXTRA_FILE]))
        elif state.extra_variables():
            ops.warning(
                f"restart: {L.Layout.at(cfg.directory).epoch_dir(epoch)} has no {L.EXTRA_FILE}; the random-layer "
                "seed states start fresh, so the resumed run will not be bit-identical"
            )
    finally:
        for data in kept.values():
            if hasattr(data, "close"):
                data.close()  # unmap now rather than at garbage collection
    record = load_record(side, verify_s, time.perf_counter() - start)
    note_resumed(cfg.directory, side, record)
    log_resumed(ops, cfg.directory, side, record)
    return side.to_dict()
