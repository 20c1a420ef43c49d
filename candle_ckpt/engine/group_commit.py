"""One checkpoint written by several processes, as the engine calls it (no framework).

Every rank of a :class:`~candle_ckpt.core.group.Group` saves in lockstep; the
storage side (:mod:`candle_ckpt.storage.multipart`) runs the commit: the
primary (the lock holder) starts a fresh ``work/``, every rank writes and
fsyncs its part, the primary checks them all, writes the manifest and the
sidecar and publishes exactly as a one-process commit; every rank hears the
outcome and returns or raises the same. A crash of any process at any moment
leaves the previous checkpoint or the new one.

The meeting points' names come from the group's own sequence
(:meth:`~candle_ckpt.core.group.Group.meeting`; the group is scoped to one
``fit`` by :func:`~candle_ckpt.core.group.scoped`), the same on every rank
because every rank saves and restores in the same order. Each wait is
bounded by :func:`group_timeout`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointSaveError
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.capture import Capture
from candle_ckpt.storage.multipart import (
    NodePart,
    SharedSave,
    hear_work_ready,
    node_local_word,
    split_note,
    write_rank_part,
)
from candle_ckpt.storage.sharded import MANIFEST
from candle_ckpt.storage.store import CheckpointStore

# Bound on each meeting point of a save or a restore: a peer that died makes the others raise after this
# (CANDLE_CKPT_GROUP_TIMEOUT_S overrides it).
GROUP_TIMEOUT_S = 300.0

#: ``(the primary's word, heard)``: what gives the word the primary carries to every rank with a commit's outcome
#: (asked once the checkpoint is published), and what every rank calls with it once committed (None: no word).
Note = tuple[Callable[[], str], Callable[[str], None]] | None


def group_timeout() -> float:
    """The bound on one meeting point, in seconds: ``CANDLE_CKPT_GROUP_TIMEOUT_S`` or :data:`GROUP_TIMEOUT_S`."""
    raw = os.environ.get("CANDLE_CKPT_GROUP_TIMEOUT_S", "").strip()
    try:
        value = float(raw) if raw else GROUP_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"CANDLE_CKPT_GROUP_TIMEOUT_S must be a number of seconds > 0; got {raw!r}")
    return value


def failed_capture(err: BaseException) -> Capture:
    """The capture of a rank whose snapshot failed: its part raises ``err``, so every rank learns it in the commit."""

    def parts(work: str) -> None:
        raise err

    return Capture(files=[], model_file=MANIFEST, nbytes=0, parts=parts)


def _sharded(cap: Capture) -> Any:
    if cap.parts is None:
        from candle_ckpt.core.errors import CheckpointSaveError  # noqa: PLC0415

        raise CheckpointSaveError("a multi-process save needs a sharded capture (parts); this one is a file set")
    return cap.parts


def _node_store(store: CheckpointStore, generation: int) -> CheckpointStore:
    """A node-local rank's own store, open (its own directory, its own lock), at the primary's ``generation``."""
    if not store.is_open:
        store.open_for_write()
    store.use_generation(generation)
    return store


def commit_epoch(
    store: CheckpointStore,
    group: Group,
    epoch: int,
    cap: Capture,
    template: Sidecar,
    best_epoch: int | None,
    note: Note = None,
) -> Sidecar | None:
    """Every rank writes its part of ``cap``; the primary commits ``epochs/NNN``. None on the other ranks, unless
    their ``ckpt_directory`` is their own (node-local): then each commits its copy there and gets its sidecar.

    ``note``: ``(the primary's word, heard)``: the word travels with the outcome (no meeting of its own) and
    ``heard(word)`` is called on every rank once the checkpoint is committed."""
    key, timeout_s = group.meeting("save"), group_timeout()
    if not is_primary(group):
        word = hear_work_ready(group, key, timeout_s)
        generation = node_local_word(store.layout, word)
        if generation is not None:
            node = NodePart(group, key, _sharded(cap), timeout_s)
            side = _node_store(store, generation).commit(epoch, [], template, best_epoch=best_epoch, shared=node)
            _heard(note, node.note)
            return side
        outcome = write_rank_part(store.layout, group, key, _sharded(cap), fs=store.fs, timeout_s=timeout_s, heard=word)
        _heard(note, split_note(outcome)[1])
        return None
    shared = SharedSave(group, key, _sharded(cap), dict(cap.sharding), dict(cap.manifest_extra), timeout_s)
    shared.note = note[0] if note is not None else None
    side = store.commit(epoch, cap.files, template, best_epoch=best_epoch, shared=shared)
    _heard(note, shared.said)
    return side


def commit_step(store: CheckpointStore, group: Group, cap: Capture, template: Sidecar, note: Note = None) -> Sidecar:
    """A step checkpoint (``steps/GGG``) written by every rank; the primary commits it; every rank gets its sidecar
    (a node-local rank: that of its own copy). ``note``: as :func:`commit_epoch`'s."""
    key, timeout_s = group.meeting("save"), group_timeout()
    if not is_primary(group):
        word = hear_work_ready(group, key, timeout_s)
        generation = node_local_word(store.layout, word)
        if generation is not None:
            node = NodePart(group, key, _sharded(cap), timeout_s)
            side = _node_store(store, generation).steps.commit([], template, shared=node)
            _heard(note, node.note)
            return side
        outcome = write_rank_part(store.layout, group, key, _sharded(cap), fs=store.fs, timeout_s=timeout_s, heard=word)
        where, said = split_note(outcome)
        generation = L.parse_step_name(where)
        if generation is None:
            raise CheckpointSaveError(f"{key}: the primary published {where!r}, not a step checkpoint (steps/GGG)")
        side = store.steps.read_sidecar(generation)
        _heard(note, said)
        return side
    shared = SharedSave(group, key, _sharded(cap), dict(cap.sharding), dict(cap.manifest_extra), timeout_s)
    shared.note = note[0] if note is not None else None
    side = store.steps.commit(cap.files, template, shared=shared)
    _heard(note, shared.said)
    return side


def _heard(note: Note, word: str) -> None:
    if note is not None:
        note[1](word)
