"""The monitored metric: its direction, "is this an improvement", and the best so far.

Everything in this module is a pure function of its arguments: there is no
I/O, no clock and no Keras/TensorFlow import. The save rule that uses it is
:class:`candle_ckpt.engine.decision.SaveDecisionPolicy`; the keep rules are in
:mod:`candle_ckpt.core.retention`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "HIGHER_IS_BETTER",
    "HIGHER_IS_BETTER_SUFFIXES",
    "BestState",
    "best_of",
    "is_improvement",
    "resolve_mode",
]

#: Metric names (after stripping a leading ``val_``) where higher is better.
HIGHER_IS_BETTER: frozenset[str] = frozenset(
    {
        "acc",
        "accuracy",
        "auc",
        "prc",
        "precision",
        "recall",
        "f1",
        "f1_score",
        "fbeta_score",
        "iou",
        "mean_iou",
        "r2",
        "r2_score",
    }
)

#: Metric name suffixes where higher is better (e.g. ``sparse_categorical_accuracy``).
HIGHER_IS_BETTER_SUFFIXES: tuple[str, ...] = ("_accuracy", "_acc", "_auc")

_MODES = ("min", "max")
_SAVE_BEST_MODES = ("auto", "min", "max")


# ---------------------------------------------------------------------------
# Metric direction
# ---------------------------------------------------------------------------


def resolve_mode(metric: str, mode: str) -> str:
    """Resolve the optimisation direction of a monitored metric.

    Mirrors Keras's ``MonitorCallback``: ``"min"`` and ``"max"`` are returned
    as is; ``"auto"`` strips one leading ``val_`` prefix and returns ``"max"``
    when the remaining name is a "higher is better" metric (one of
    :data:`HIGHER_IS_BETTER`, or ending with one of
    :data:`HIGHER_IS_BETTER_SUFFIXES`), otherwise ``"min"``. Metric names and
    modes are compared case-insensitively.

    Args:
        metric: Name of the monitored metric, e.g. ``"val_loss"``.
        mode: One of ``"auto"``, ``"min"`` or ``"max"``.

    Returns:
        ``"min"`` or ``"max"``.

    Raises:
        ValueError: If ``mode`` is not one of the allowed values.
    """
    if not isinstance(mode, str) or mode.strip().lower() not in _SAVE_BEST_MODES:
        raise ValueError(f"ckpt_save_best_mode must be one of {', '.join(_SAVE_BEST_MODES)}; got {mode!r}")
    mode = mode.strip().lower()
    if mode != "auto":
        return mode
    name = metric.strip().lower()
    name = name.removeprefix("val_")
    if name in HIGHER_IS_BETTER or name.endswith(HIGHER_IS_BETTER_SUFFIXES):
        return "max"
    return "min"


def _check_direction(mode: str) -> None:
    """Raise ``ValueError`` unless ``mode`` is ``"min"`` or ``"max"``."""
    if mode not in _MODES:
        raise ValueError(f"mode must be 'min' or 'max' (resolve 'auto' with resolve_mode first); got {mode!r}")


def is_improvement(current: float, best: float | None, mode: str) -> bool:
    """Tell whether ``current`` improves on ``best``.

    There is no infinite sentinel: ``best=None`` means "nothing seen yet", so
    the first finite value always improves, whatever the direction. (CANDLE
    started every metric from ``+inf``, so ``"max"`` metrics never improved.)
    A non-finite ``current`` (NaN or +/-inf) never improves. A NaN ``best``
    is treated like ``None``.

    Args:
        current: The newly observed metric value.
        best: The best value so far, or ``None`` if there is none.
        mode: ``"min"`` or ``"max"``.

    Returns:
        ``True`` if ``current`` is an improvement.

    Raises:
        ValueError: If ``mode`` is not ``"min"`` or ``"max"``.
    """
    _check_direction(mode)
    if not math.isfinite(current):
        return False
    if best is None or math.isnan(best):
        return True
    if mode == "min":
        return current < best
    return current > best


# ---------------------------------------------------------------------------
# Best tracking
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BestState:
    """Immutable record of the best monitored value seen so far.

    Attributes:
        metric: Name of the monitored metric.
        mode: ``"min"`` or ``"max"`` (already resolved).
        value: Best value so far, or ``None`` before the first improvement.
        epoch: Epoch (completed-epoch count) of ``value``, or ``None``.
    """

    metric: str
    mode: str
    value: float | None = None
    epoch: int | None = None

    def __post_init__(self) -> None:
        """Validate the direction.

        Raises:
            ValueError: If ``mode`` is not ``"min"`` or ``"max"``.
        """
        _check_direction(self.mode)

    def update(self, value: float, epoch: int) -> tuple[BestState, bool]:
        """Offer a new observation.

        Args:
            value: Metric value observed at ``epoch``.
            epoch: Completed-epoch count the value belongs to.

        Returns:
            ``(new_state, improved)``; ``new_state`` is ``self`` when the
            value did not improve.
        """
        if is_improvement(value, self.value, self.mode):
            return replace(self, value=float(value), epoch=epoch), True
        return self, False


def best_of(values: Mapping[int, Any], mode: str) -> int | None:
    """The epoch of the best of ``values`` (``{epoch: metric value}``), as best tracking would have found it.

    The epochs are offered in order to :meth:`BestState.update`: a later equal value is no improvement, so
    the earliest of equal bests wins; a value that is not a finite number never wins.

    Args:
        values: The monitored metric's value at each epoch.
        mode: ``"min"`` or ``"max"``.

    Returns:
        The best epoch, or None if no value is a finite number.
    """
    best = BestState("", mode)
    for epoch in sorted(values):
        value = values[epoch]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            best, _ = best.update(float(value), epoch)
    return best.epoch
