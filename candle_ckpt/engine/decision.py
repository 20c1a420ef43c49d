"""The save rule: whether (and why) an epoch end is saved, and the best epoch so far. Its one home.

:class:`SaveDecisionPolicy` decides; :class:`~candle_ckpt.engine.engine.CheckpointEngine`
asks it at every epoch end, with the epoch, the logs and a :class:`DecisionContext`
(a save forced by preemption, a write still in flight), and does what it answers.
Nothing else decides whether to save, and "checkpointing is off"
(``ckpt_save_interval=0``) is :func:`checkpointing_off`, asked by everyone who
must know (the engine, the preemption watchers). Modelled on Orbax's ``SaveDecisionPolicy.should_save(step, ...,
context)`` with its ``DecisionContext``. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.policy import BestState, is_improvement, resolve_mode
from candle_ckpt.core.sidecar import Sidecar


@dataclass(frozen=True)
class DecisionContext:
    """What the engine knows at an epoch end besides the epoch and the logs.

    Attributes:
        forced: A reason that saves this epoch whatever the rule says (a
            preemption: ``"SIGTERM"``, ``"deadline"``; the runner's ``"init"``).
        saving_in_progress: A write is in flight (async mode).
    """

    forced: str | None = None
    saving_in_progress: bool = False


@dataclass(frozen=True)
class Decision:
    """The answer: save (and why) or not, and the best state if this epoch is saved.

    Attributes:
        reason: ``"best"``, ``"final"``, ``"interval"``, the forced reason, or
            None (no save).
        best: The best state to record with this save.
        ask_again: No save now only because a best is still being written; if
            that write fails, this epoch is the new best. Wait for the write in
            flight and ask again (rare; costs one wait).
    """

    reason: str | None
    best: BestState
    ask_again: bool = False


class SaveDecisionPolicy:
    """The save rule of one job, and its best tracking.

    The rule, first match wins (CANDLE's order):

    1. ``ckpt_save_interval=0``: never (checkpointing is off: not the final save, not a forced one).
    2. ``ckpt_save_best`` and the metric is not in the logs: :class:`ValueError`
       (at every epoch end, skipped epochs included: a wrong metric fails at epoch 1).
    3. ``epoch < ckpt_skip_epochs``: no save.
    4. ``ckpt_save_best`` and the metric improved: ``"best"``.
    5. ``epoch == epochs``: ``"final"``.
    6. ``epoch % ckpt_save_interval == 0``: ``"interval"``.

    Otherwise a forced save (:attr:`DecisionContext.forced`) is saved with its own reason.

    Args:
        cfg: The job's configuration.

    Attributes:
        mode: The metric's direction, ``"min"`` or ``"max"`` (``auto`` resolved).
        best: The best so far, counting saves not yet committed.
        durable: The best as of the last commit that succeeded.
    """

    def __init__(self, cfg: CkptConfig) -> None:
        self.cfg = cfg
        self.mode = resolve_mode(cfg.save_best_metric, cfg.save_best_mode)
        self.resume(None)

    @property
    def off(self) -> bool:
        """Checkpointing is off (see :func:`checkpointing_off`)."""
        return checkpointing_off(self.cfg)

    def resume(self, resumed: Sidecar | None) -> None:
        """Continue best tracking from a restored checkpoint (or start afresh with None)."""
        self.best = self.durable = resumed_best(self.cfg, self.mode, resumed)

    def should_save(self, epoch: int, logs: Mapping[str, Any], context: DecisionContext | None = None) -> Decision:
        """Decide for the end of ``epoch`` (completed epochs); changes nothing.

        Raises:
            ValueError: ``ckpt_save_best_metric`` is not in ``logs`` (not raised for a forced save).
        """
        context = context or DecisionContext()
        if self.off:
            return Decision(None, self.best)
        if context.forced is not None and self.cfg.save_best_metric not in logs:
            return Decision(context.forced, self.best)  # (the runner's epoch 0): best tracking stays as it is
        reason, best = self._rule(epoch, logs)
        if context.forced is not None:
            return Decision(context.forced, best)
        if reason is None and context.saving_in_progress and self._beats_durable_only(logs):
            return Decision(None, best, ask_again=True)
        return Decision(reason, best)

    def submitted(self, best: BestState) -> None:
        """A save was handed to the writer with ``best``."""
        self.best = best

    def committed(self, best: BestState) -> None:
        """The save of ``best`` is durable."""
        self.durable = best

    def failed(self, epoch: int) -> None:
        """The save of ``epoch`` failed: if it was the best, track against the durable one."""
        if self.best.epoch == epoch:
            self.best = self.durable

    def _rule(self, epoch: int, logs: Mapping[str, Any]) -> tuple[str | None, BestState]:
        cfg = self.cfg
        if cfg.save_best and cfg.save_best_metric not in logs:
            raise ValueError(missing_metric_message(cfg, epoch, logs))
        if epoch < cfg.skip_epochs:
            return None, self.best
        if cfg.save_best:
            best, improved = self.best.update(float(logs[cfg.save_best_metric]), epoch)
            if improved:
                return "best", best
        if epoch == cfg.epochs:
            return "final", self.best
        if epoch % cfg.save_interval == 0:
            return "interval", self.best
        return None, self.best

    def _beats_durable_only(self, logs: Mapping[str, Any]) -> bool:
        """True if this epoch is no new best only because of a best still being written."""
        if not (self.cfg.save_best and self.best.epoch != self.durable.epoch):
            return False
        try:
            value = float(logs[self.cfg.save_best_metric])
        except (KeyError, TypeError, ValueError):
            return False  # _rule has already said what is wrong with the logs
        return is_improvement(value, self.durable.value, self.mode)


def checkpointing_off(cfg: CkptConfig) -> bool:
    """Checkpointing is off (``ckpt_save_interval=0``): nothing is saved, not even a forced save,
    nothing is written (not even ``ckpt.log``) and no preemption signal is caught."""
    return cfg.save_interval == 0


def hang_timeout(cfg: CkptConfig) -> float | str | None:
    """``ckpt_hang_timeout`` as a :class:`~candle_ckpt.engine.watchdog.Watchdog` takes it: ``"auto"`` or seconds,
    or None (no watchdog) when it is none or checkpointing is off (the run's watchdog and the restore's alike)."""
    return None if checkpointing_off(cfg) or cfg.hang_timeout == "none" else cfg.hang_timeout


def saves_epoch(cfg: CkptConfig, done: int) -> bool:
    """The end of epoch ``done`` (completed epochs) is saved whatever the metrics say (rules 1, 3, 5 and 6 of
    :class:`SaveDecisionPolicy`; a new best may save an epoch that this says no to)."""
    if checkpointing_off(cfg) or done < cfg.skip_epochs:
        return False
    return done == cfg.epochs or done % cfg.save_interval == 0


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
