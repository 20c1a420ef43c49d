"""Pure checkpoint policy: metric direction, best tracking, save and keep rules.

Everything in this module is a pure function of its arguments: there is no
I/O, no clock and no Keras/TensorFlow import. Keep policies work on epoch
numbers (records), never on files; callers map the result onto files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

__all__ = [
    "HIGHER_IS_BETTER",
    "HIGHER_IS_BETTER_SUFFIXES",
    "BestState",
    "KeepExponential",
    "KeepLatest",
    "KeepPolicy",
    "is_improvement",
    "keep_policy",
    "prune_plan",
    "resolve_mode",
    "save_reason",
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
_KEEP_MODES = ("linear", "exponential", "all")


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


def is_improvement(current: float, best: float | None, mode: str, min_delta: float = 0.0) -> bool:
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
        min_delta: Non-negative margin ``current`` must beat ``best`` by.

    Returns:
        ``True`` if ``current`` is an improvement.

    Raises:
        ValueError: If ``mode`` is not ``"min"``/``"max"`` or ``min_delta``
            is negative or NaN.
    """
    _check_direction(mode)
    if not min_delta >= 0.0:
        raise ValueError(f"min_delta must be >= 0; got {min_delta!r}")
    if not math.isfinite(current):
        return False
    if best is None or math.isnan(best):
        return True
    if mode == "min":
        return current < best - min_delta
    return current > best + min_delta


# ---------------------------------------------------------------------------
# Best tracking
# ---------------------------------------------------------------------------


def _is_int(x: object) -> bool:
    """Return ``True`` for a real ``int`` (``bool`` excluded)."""
    return isinstance(x, int) and not isinstance(x, bool)


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

    def to_dict(self) -> dict[str, Any]:
        """Serialise to a JSON-compatible dict.

        Returns:
            A dict with keys ``metric``, ``mode``, ``value`` and ``epoch``.
        """
        return {
            "metric": self.metric,
            "mode": self.mode,
            "value": None if self.value is None else float(self.value),
            "epoch": self.epoch,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BestState:
        """Build a state from :meth:`to_dict` output, validating every field.

        ``metric`` and ``mode`` are required; ``value`` and ``epoch`` default
        to ``None`` but must be both ``None`` or both set. Unknown keys are
        ignored for forward compatibility.

        Args:
            d: Mapping as produced by :meth:`to_dict`.

        Returns:
            The reconstructed state.

        Raises:
            ValueError: If ``d`` is not a mapping or a field is missing or has
                the wrong type or value.
        """
        if not isinstance(d, Mapping):
            # ValueError, not TypeError: callers treat any malformed state alike.
            raise ValueError(  # noqa: TRY004
                f"best state must be a mapping; got {type(d).__name__}"
            )
        for key in ("metric", "mode"):
            if key not in d:
                raise ValueError(f"best state is missing {key!r}")
        metric, mode = d["metric"], d["mode"]
        value, epoch = d.get("value"), d.get("epoch")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"best state 'metric' must be a non-empty str; got {metric!r}")
        if mode not in _MODES:
            raise ValueError(f"best state 'mode' must be 'min' or 'max'; got {mode!r}")
        if value is not None and (
            not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
        ):
            raise ValueError(f"best state 'value' must be a finite number or None; got {value!r}")
        if epoch is not None and (not _is_int(epoch) or epoch < 0):
            raise ValueError(f"best state 'epoch' must be a non-negative int or None; got {epoch!r}")
        if (value is None) != (epoch is None):
            raise ValueError(
                f"best state 'value' and 'epoch' must be both set or both None; got value={value!r}, epoch={epoch!r}"
            )
        return cls(
            metric=metric,
            mode=mode,
            value=None if value is None else float(value),
            epoch=epoch,
        )

    def update(self, value: float, epoch: int, min_delta: float = 0.0) -> tuple[BestState, bool]:
        """Offer a new observation.

        Args:
            value: Metric value observed at ``epoch``.
            epoch: Completed-epoch count the value belongs to.
            min_delta: Non-negative margin required to count as improvement.

        Returns:
            ``(new_state, improved)``; ``new_state`` is ``self`` when the
            value did not improve.
        """
        if is_improvement(value, self.value, self.mode, min_delta):
            return replace(self, value=float(value), epoch=epoch), True
        return self, False


# ---------------------------------------------------------------------------
# Save decision
# ---------------------------------------------------------------------------


def save_reason(
    epoch: int,
    *,
    epochs: int,
    skip_epochs: int,
    save_interval: int,
    improved_best: bool,
    save_best: bool,
) -> str | None:
    """Decide whether (and why) to save after an epoch, in CANDLE's order.

    The checks run in this order, first match wins:

    1. ``save_interval == 0``: ``None`` (saving disabled, even the final one).
    2. ``epoch < skip_epochs``: ``None``.
    3. ``save_best and improved_best``: ``"best"``.
    4. ``epoch == epochs``: ``"final"``.
    5. ``epoch % save_interval == 0``: ``"interval"``.
    6. Otherwise ``None``.

    Args:
        epoch: Number of completed epochs (1-based: the epoch just finished).
        epochs: Total number of epochs of the run.
        skip_epochs: Epochs before which nothing is saved.
        save_interval: Save every this many epochs; 0 disables saving.
        improved_best: Whether the monitored metric improved this epoch.
        save_best: Whether saving on best improvement is enabled.

    Returns:
        ``"best"``, ``"final"``, ``"interval"`` or ``None`` (do not save).

    Raises:
        ValueError: If ``save_interval`` is negative.
    """
    if save_interval < 0:
        raise ValueError(f"ckpt_save_interval must be >= 0; got {save_interval!r}")
    if save_interval == 0:
        return None
    if epoch < skip_epochs:
        return None
    if save_best and improved_best:
        return "best"
    if epoch == epochs:
        return "final"
    if epoch % save_interval == 0:
        return "interval"
    return None


# ---------------------------------------------------------------------------
# Keep policies
# ---------------------------------------------------------------------------


class KeepPolicy(Protocol):
    """A retention rule over epoch numbers."""

    limit: int

    def select(self, epochs: Iterable[int], protected: Iterable[int] = ()) -> set[int]:
        """Return the subset of ``epochs`` to keep."""
        ...


def _check_limit(limit: int) -> None:
    """Raise ``ValueError`` unless ``limit`` is an int >= 1."""
    if not _is_int(limit) or limit < 1:
        raise ValueError(f"ckpt_keep_limit must be an int >= 1; got {limit!r}")


class _Limited:
    """A keep policy with one knob, ``limit`` (an int >= 1)."""

    def __init__(self, limit: int) -> None:
        """Create the policy.

        Raises:
            ValueError: If ``limit`` is not an int >= 1.
        """
        _check_limit(limit)
        self.limit = limit

    def __repr__(self) -> str:
        """Return ``KeepLatest(limit=N)`` or ``KeepExponential(limit=N)``."""
        return f"{type(self).__name__}(limit={self.limit})"


class KeepLatest(_Limited):
    """Keep the ``limit`` newest epochs (linear retention).

    Rule: keep the ``limit`` highest epochs of the input, plus every protected
    epoch that is present in the input. Protected epochs absent from the input
    are ignored; the result is always a subset of the input, with at most
    ``limit + len(protected)`` members.

    Attributes:
        limit: Number of newest epochs to keep (>= 1).
    """

    def select(self, epochs: Iterable[int], protected: Iterable[int] = ()) -> set[int]:
        """Return the epochs to keep.

        Args:
            epochs: Epoch numbers that currently exist.
            protected: Epochs that must be kept if present (e.g. the best).

        Returns:
            The set of epochs to keep, a subset of ``epochs``.
        """
        present = set(epochs)
        keep = set(sorted(present, reverse=True)[: self.limit])
        return keep | (present & set(protected))


class KeepExponential(_Limited):
    """Keep exponentially spaced epochs (logarithmic retention).

    Rule: let n be the newest epoch in the input. Keep n. For each k >= 0,
    among the input epochs whose age a = n - e satisfies
    2**k <= a < 2**(k+1), keep the newest one (smallest age). Then, if more
    than ``limit`` remain, drop the oldest until ``limit`` remain (n is always
    kept). Finally add every protected epoch present in the input; protected
    epochs absent from the input are ignored, so the result is always a subset
    of the input. The retained count is therefore at most
    min(limit, floor(log2(n - oldest)) + 2) + len(protected): O(log epochs).
    Applying the rule to its own output returns the same set.

    Attributes:
        limit: Maximum number of epochs kept before protected ones (>= 1).
    """

    def select(self, epochs: Iterable[int], protected: Iterable[int] = ()) -> set[int]:
        """Return the epochs to keep.

        Args:
            epochs: Epoch numbers that currently exist.
            protected: Epochs that must be kept if present (e.g. the best).

        Returns:
            The set of epochs to keep, a subset of ``epochs``.
        """
        present = set(epochs)
        if not present:
            return set()
        newest = max(present)
        # Bucket k holds ages in [2**k, 2**(k+1)); age 0 (newest) is bucket -1.
        buckets: dict[int, int] = {}
        for e in present:
            k = (newest - e).bit_length() - 1
            if k not in buckets or e > buckets[k]:
                buckets[k] = e
        keep = set(sorted(buckets.values(), reverse=True)[: self.limit])
        return keep | (present & set(protected))


class KeepAll(_Limited):
    """Keep every epoch (CANDLE's ``ckpt_keep_mode=all``): ``limit`` is recorded, not applied."""

    def select(self, epochs: Iterable[int], protected: Iterable[int] = ()) -> set[int]:
        """Return every epoch of the input."""
        return set(epochs)


def keep_policy(mode: str, limit: int) -> KeepLatest | KeepExponential | KeepAll:
    """Build a keep policy from CANDLE-style configuration.

    Args:
        mode: ``"linear"`` (:class:`KeepLatest`), ``"exponential"``
            (:class:`KeepExponential`) or ``"all"`` (:class:`KeepAll`).
        limit: Policy limit, >= 1.

    Returns:
        The policy instance.

    Raises:
        ValueError: If ``mode`` is unknown (names ``ckpt_keep_mode``) or
            ``limit`` < 1 (names ``ckpt_keep_limit``).
    """
    if mode == "linear":
        return KeepLatest(limit)
    if mode == "exponential":
        return KeepExponential(limit)
    if mode == "all":
        return KeepAll(limit)
    raise ValueError(f"ckpt_keep_mode must be one of {', '.join(_KEEP_MODES)}; got {mode!r}")


def prune_plan(epochs: Iterable[int], policy: KeepPolicy, protected: Iterable[int] = ()) -> tuple[list[int], list[int]]:
    """Split existing epochs into those to keep and those to delete.

    Args:
        epochs: Epoch numbers that currently exist (duplicates are merged).
        policy: A keep policy such as :class:`KeepLatest`.
        protected: Epochs that must be kept if present.

    Returns:
        ``(keep_sorted, delete_sorted)``, both ascending and disjoint, whose
        union is the set of input epochs.
    """
    present = set(epochs)
    keep = policy.select(present, tuple(protected)) & present
    return sorted(keep), sorted(present - keep)
