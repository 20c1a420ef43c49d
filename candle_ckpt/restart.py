"""``restart()``: resume a job from its newest valid checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from candle_ckpt.engine import note_resumed
from candle_ckpt.keras_capture import KerasModelAdapter
from candle_ckpt.oplog import OpsLog, get_logger
from candle_ckpt.params import CkptConfig
from candle_ckpt.resume import choose_checkpoint
from candle_ckpt.store import CheckpointStore


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
    Under a multi-worker ``tf.distribute`` strategy (the model was built in its
    scope) the chief chooses the checkpoint and every worker loads that one
    (see :class:`~candle_ckpt.distributed.WorkerTrainingState`).

    Returns:
        The restored checkpoint's ``ckpt-info.json`` as a dict (``"epoch"`` is
        the number of completed epochs: pass it as ``initial_epoch``), or None.
    """
    cfg = CkptConfig.from_params(gParameters)
    if cfg.restart_mode == "off":
        return None
    if _is_tf_keras(model):
        from candle_ckpt.tf_keras import restart as tf_keras_restart

        return tf_keras_restart(gParameters, model, logger, verbose)
    strategy = _multi_worker_strategy(model)
    if strategy is not None:
        from candle_ckpt.distributed import WorkerTrainingState

        wts = WorkerTrainingState(gParameters, model, strategy, logger=logger, verbose=verbose, writable=False)
        return wts.restore()
    return restore_with(cfg, KerasModelAdapter(model), logger, verbose)


def restore_with(
    cfg: CkptConfig, adapter, logger: str | logging.Logger | None = "DEFAULT", verbose: bool = True
) -> dict[str, Any] | None:
    """Single-process restart through ``adapter`` (see :class:`KerasModelAdapter`)."""
    store = CheckpointStore(cfg.directory, checksum=cfg.checksum)
    ops = OpsLog(store.layout.log, get_logger(logger, verbose))
    try:
        chosen = choose_checkpoint(cfg, store, ops, adapter.keep_files)
    except Exception:
        note_resumed(cfg.directory, None)
        raise
    if chosen is None:
        note_resumed(cfg.directory, None)
        return None
    where = store.layout.epoch_dir(chosen.epoch)
    adapter.restore(chosen, ops, where)
    note_resumed(cfg.directory, chosen.sidecar)
    ops.info(f"restart: resumed from {where} (epoch {chosen.epoch}, generation {chosen.sidecar.generation})")
    return chosen.sidecar.to_dict()


def _multi_worker_strategy(model):
    """The model's tf.distribute strategy if it spans several workers, else None."""
    strategy = getattr(model, "_distribute_strategy", None) or getattr(model, "distribute_strategy", None)
    if strategy is None or type(strategy).__module__.split(".")[0] != "tensorflow":
        return None
    from candle_ckpt.distributed import worker_info

    return strategy if worker_info(strategy).num_workers > 1 else None


def _is_tf_keras(model) -> bool:
    return any(cls.__module__.split(".")[0] == "tf_keras" for cls in type(model).__mro__)
