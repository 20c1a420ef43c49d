"""Which epoch checkpoints are the job's history, and which a rollback abandoned: read from the sidecars alone.

A rollback (``candle-ckpt rollback``, ``ckpt_restart_epoch``) re-points ``last`` to an earlier epoch; the
run that resumes from it saves a new lineage, each save replacing the old checkpoint of its epoch. What
the abandoned run saved past the point the new one has reached stays on disk. The sidecars tell the
two apart: each records its ``epoch``, its commit order (``generation``) and the epoch its run resumed
from (``resumed_from``, None for a run from scratch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Record(NamedTuple):
    """What :func:`current_lineage` reads of one checkpoint's sidecar."""

    generation: int
    resumed_from: int | None


def current_lineage(records: Mapping[int, Record], head: int | None) -> set[int]:
    """The epochs of ``records`` that lead to ``head`` (the epoch ``last`` points to): the job's history.

    Walking back from ``head``, the parent of a checkpoint ``c`` is the latest epoch before it that was
    committed before it and, unless it lies at or before the epoch ``c``'s run resumed from, was saved
    by a run that started where ``c``'s did (same ``resumed_from``: an older run's epoch that ``c``'s
    run did not save again, at another ``ckpt_save_interval``, is not ``c``'s past). Every other epoch
    of ``records`` belongs to an abandoned lineage. A ``head`` missing from ``records`` (no ``last``,
    or its sidecar unreadable) gives the empty set: nothing can be told apart then, and a caller
    treats every checkpoint as the job's.

    Args:
        records: ``{epoch: Record}`` of every checkpoint whose sidecar could be read.
        head: The epoch ``last`` points to, or None.

    Returns:
        The epochs of the current lineage, ``head`` included.
    """
    if head is None or head not in records:
        return set()
    chain = {head}
    child = head
    while True:
        run_start = records[child].resumed_from
        parents = [
            epoch
            for epoch, record in records.items()
            if epoch < child
            and (record.generation, epoch) < (records[child].generation, child)
            and ((run_start is not None and epoch <= run_start) or record.resumed_from == run_start)
        ]
        if not parents:
            return chain
        child = max(parents)
        chain.add(child)
