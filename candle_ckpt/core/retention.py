"""The retention policy: which checkpoints to retain (the ``ckpt_keep_*`` rules), as pure functions of epoch numbers.

Each policy is a small class named after its rule with one pure method,
``select(epochs, protected)``, that sees epoch numbers (records), never files;
:func:`prune_plan` is the one retention rule the store, the CLI and the remote
mirror apply (protected epochs are always kept, the policy decides the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from candle_ckpt.config.checkpoint_keys import KEEP_MODES

__all__ = [
    "ABANDONED_OFFSET",
    "KeepAll",
    "KeepExponential",
    "KeepLatest",
    "RetentionPolicy",
    "retention_policy",
    "prune_plan",
]


class RetentionPolicy(Protocol):
    """A retention rule over epoch numbers."""

    limit: int

    def select(self, epochs: Iterable[int], protected: Iterable[int] = ()) -> set[int]:
        """Return the subset of ``epochs`` to keep."""
        ...


def _check_limit(limit: int) -> None:
    """Raise ``ValueError`` unless ``limit`` is an int >= 1."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"ckpt_keep_limit must be an int >= 1; got {limit!r}")


class _Limited:
    """A retention policy with one knob, ``limit`` (an int >= 1)."""

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


#: How far below the current lineage :func:`prune_plan` ranks an epoch a rollback abandoned (epoch names have at
#: most 9 digits: every abandoned epoch ranks below epoch 0, and far enough that the exponential rule gives them
#: two of its slots at most).
ABANDONED_OFFSET = 1 << 40

#: Each ``ckpt_keep_mode`` name (the schema's choices) and its rule.
_RULES: dict[str, type[_Limited]] = {"linear": KeepLatest, "exponential": KeepExponential, "all": KeepAll}


def retention_policy(mode: str, limit: int) -> KeepLatest | KeepExponential | KeepAll:
    """Build the retention policy from CANDLE-style configuration.

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
    rule = _RULES.get(mode) if isinstance(mode, str) else None
    if rule is None:
        raise ValueError(f"ckpt_keep_mode must be one of {', '.join(KEEP_MODES)}; got {mode!r}")
    return rule(limit)


def prune_plan(
    epochs: Iterable[int],
    select: Callable[[set[int], tuple[int, ...]], Iterable[int]],
    protected: Iterable[int] = (),
    abandoned: Iterable[int] = (),
) -> tuple[list[int], list[int]]:
    """Split existing epochs into those to keep and those to delete: the one retention rule.

    Every protected epoch present is kept (the store and the remote mirror
    protect ``best``, ``last`` and the checkpoint in use), whatever ``select``
    returns; ``select`` decides the rest.

    The current lineage comes first: the checkpoints a rollback ``abandoned``
    (:mod:`candle_ckpt.core.lineage`) rank as older than every checkpoint of the
    lineage, in their own order: ``select`` sees each as ``epoch - ABANDONED_OFFSET``
    (``KeepLatest(2)`` after a rollback to 3 of a 40-epoch run keeps 2 and 3, not 39
    and 40). They are kept only where the rule leaves room; the offset is a constant,
    so pruning twice is pruning once.

    Args:
        epochs: Epoch numbers that currently exist (duplicates are merged).
        select: A retention policy's ``select(epochs, protected)``, such as ``KeepLatest(5).select``.
        protected: Epochs that must be kept if present.
        abandoned: Epochs of a lineage a rollback abandoned (those absent from ``epochs`` are ignored).

    Returns:
        ``(keep_sorted, delete_sorted)``, both ascending and disjoint, whose
        union is the set of input epochs.
    """
    present = set(epochs)
    kept_always = present & set(protected)
    old = present & set(abandoned)
    rank = {e: e - ABANDONED_OFFSET if e in old else e for e in present}
    back = {r: e for e, r in rank.items()}
    chosen = select(set(rank.values()), tuple(sorted(rank[e] for e in kept_always)))
    keep = ({back[r] for r in chosen if r in back} | kept_always) & present
    return sorted(keep), sorted(present - keep)
