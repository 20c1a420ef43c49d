"""Whether an epoch end is saved: the save rule, best tracking, and the missing-metric error.

Pure functions over the config and the best so far (no I/O), used by
:class:`~candle_ckpt.engine.engine.CheckpointEngine`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.policy import BestState, is_improvement, save_reason
from candle_ckpt.core.sidecar import Sidecar


def missing_metric_message(cfg: CkptConfig, epoch: int, logs: Mapping[str, Any]) -> str:
    """Why ``ckpt_save_best_metric`` is not in the logs, and the three ways out."""
    metric = cfg.save_best_metric
    present = ", ".join(sorted(logs)) or "none"
    fixes = [
        "pass validation data to fit (validation_data=... or validation_split=0.2)"
        if metric.startswith("val_")
        else f"log {metric!r} (compile the model with that metric)",
        f"set ckpt_save_best_metric to a metric that is logged ({present})",
        "or set ckpt_save_best=False to checkpoint without tracking the best epoch",
    ]
    return (
        f"ckpt_save_best_metric {metric!r} is not in the training logs of epoch {epoch}; metrics present: "
        f"{present}. To fix it: {'; '.join(fixes)} (checkpoint directory: {os.path.abspath(cfg.directory)})"
    )


def decide(cfg: CkptConfig, best: BestState, epoch: int, logs: Mapping[str, Any]) -> tuple[str | None, BestState]:
    """Return (reason to save ``epoch`` or None, the best state if it is saved).

    Raises:
        ValueError: ``ckpt_save_best_metric`` is not in ``logs`` (checked at every epoch end,
            skipped epochs included: a wrong metric fails at epoch 1, as in CANDLE).
    """
    improved = False
    if cfg.save_best and cfg.save_interval != 0 and cfg.save_best_metric not in logs:
        raise ValueError(missing_metric_message(cfg, epoch, logs))
    if cfg.save_best and cfg.save_interval != 0 and epoch >= cfg.skip_epochs:
        best, improved = best.update(float(logs[cfg.save_best_metric]), epoch)
    reason = save_reason(
        epoch,
        epochs=cfg.epochs if cfg.epochs is not None else -1,
        skip_epochs=cfg.skip_epochs,
        save_interval=cfg.save_interval,
        improved_best=improved,
        save_best=cfg.save_best,
    )
    return reason, best


def beats_durable_best_only(
    cfg: CkptConfig, mode: str, pending: BestState, durable: BestState, logs: Mapping[str, Any]
) -> bool:
    """True if this epoch is no new best only because of a best still being written (``pending``).

    If that write fails, this epoch *is* the new best: the caller must wait
    for the outcome before deciding (rare; costs one wait).
    """
    if not (cfg.save_best and pending.epoch != durable.epoch):
        return False
    try:
        value = float(logs[cfg.save_best_metric])
    except (KeyError, TypeError, ValueError):
        return False  # decide() has already said what is wrong with the logs
    return is_improvement(value, durable.value, mode)


def resumed_best(cfg: CkptConfig, mode: str, resumed: Sidecar | None) -> BestState:
    """The best to beat after a restart: the checkpoint's (same metric), or CANDLE's ``ckpt_best_metric_last``."""
    best = BestState(cfg.save_best_metric, mode)
    if resumed is not None and resumed.best_epoch is not None and resumed.save_best_metric == cfg.save_best_metric:
        value = resumed.best_metric_last
        if isinstance(value, (int, float)) and math.isfinite(value):
            best = BestState(cfg.save_best_metric, mode, float(value), resumed.best_epoch)
    if cfg.best_metric_last is not None and math.isfinite(cfg.best_metric_last):
        # The value to beat. Its epoch is known only when it is the value of the checkpoint restart() loaded.
        epoch = best.epoch if best.value == cfg.best_metric_last else None
        best = BestState(cfg.save_best_metric, mode, cfg.best_metric_last, epoch)
    return best
