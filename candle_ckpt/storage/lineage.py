"""The current lineage of a checkpoint directory: which epochs a rollback abandoned, and the lineage's best.

:func:`candle_ckpt.core.lineage.current_lineage` is the rule; this module reads the sidecars it needs. Its
readers: the store's pruning (the current lineage is retained first, see
:func:`candle_ckpt.core.retention.prune_plan`), :meth:`CheckpointStore.rollback
<candle_ckpt.storage.store.CheckpointStore.rollback>` (where ``best`` goes), and ``candle-ckpt list`` /
``verify`` (which checkpoints they mark as abandoned).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.lineage import Record, current_lineage
from candle_ckpt.core.policy import best_of, resolve_mode
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.reader import CheckpointReader


def readable_sidecars(reader: CheckpointReader) -> dict[int, Sidecar]:
    """``{epoch: sidecar}`` of every epoch checkpoint whose sidecar can be read (the others are left out)."""
    sides = {}
    for epoch in reader.epochs():
        try:
            sides[epoch] = reader.read_sidecar(epoch)
        except CheckpointError:
            continue
    return sides


def lineage_of(sides: dict[int, Sidecar], head: int | None) -> set[int]:
    """The epochs of ``sides`` on the way to ``head`` (the epoch ``last`` points to); empty if that cannot be told."""
    return current_lineage({e: Record(s.generation, s.resumed_from) for e, s in sides.items()}, head)


def abandoned_epochs(reader: CheckpointReader, last: int | None) -> list[int]:
    """The epochs on disk that a rollback abandoned: not on the way to ``last``, the epoch the ``last`` link points
    to (read once by the caller: a bad link is warned about once).

    A checkpoint whose sidecar cannot be read is never called abandoned (its own problem is reported
    instead), and without a readable ``last`` nothing is.
    """
    sides = readable_sidecars(reader)
    lineage = lineage_of(sides, last)
    return sorted(e for e in sides if lineage and e not in lineage)


@dataclass(frozen=True)
class LineageBest:
    """The best checkpoint of a lineage by its monitored metric (``epoch`` None: none records a value)."""

    epoch: int | None
    metric: str | None
    mode: str | None
    lineage: list[int] = field(default_factory=list)  # the lineage's epochs on disk, ascending


def lineage_best(sides: dict[int, Sidecar], head: int) -> LineageBest:
    """The checkpoint of ``head``'s lineage with the best value of the metric ``head`` monitors, in its mode.

    The values are each sidecar's ``logs``; the earliest of equal bests wins, as best tracking decides
    (:func:`~candle_ckpt.core.policy.best_of`), so a resumed run goes on from the same best.
    """
    lineage = sorted(lineage_of(sides, head)) if head in sides else []
    metric = sides[head].save_best_metric if head in sides else None
    if not metric:
        return LineageBest(None, None, None, lineage)
    recorded = sides[head].save_best_mode
    mode = recorded if recorded in ("min", "max") else resolve_mode(metric, "auto")
    values = {e: sides[e].logs.get(metric) for e in lineage}
    return LineageBest(best_of(values, mode), metric, mode, lineage)
