"""One checkpoint written by several processes: every rank writes its part, the primary commits (no framework).

The order, on every rank of a :class:`~candle_ckpt.core.group.Group` (see docs/format.rst):

1. the primary (the lock holder) starts a fresh ``work/`` and says so
   (``broadcast``: ``ok`` or the error, so no rank writes into a stale one);
2. every rank writes its part (``part-RRRRR.bin/.json``, its train state) into
   ``work/`` and fsyncs it; ``all_agree`` tells every rank whether all did;
3. the primary checks every part (present, size, CRC32) and writes
   ``manifest.json``, its own files (the model's config) and the sidecar that
   lists them all, then publishes exactly as a one-process commit (rename,
   ``last``/``best``); it broadcasts the outcome and every rank returns or
   raises the same.

A crash of any process at any moment leaves the previous checkpoint or the new
one: nothing is visible before the primary's rename, and a half-written
``work/`` is debris to the next writer. The meeting points' names come from a
per-process sequence, the same on every rank because every rank saves and
restores in the same order.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.group import Group
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.core.stats import mb_per_s, seconds
from candle_ckpt.engine.capture import Capture
from candle_ckpt.storage.commit import (
    FileSpec,
    discard_work,
    fresh_work,
    publish,
    raw_link,
    remove_trash,
    unpublish,
    write_files,
)
from candle_ckpt.storage.sharded import MANIFEST, write_manifest
from candle_ckpt.storage.store import CheckpointStore

# Bound on each meeting point of a save or a restore: a peer that died makes the others raise after this
# (CANDLE_CKPT_GROUP_TIMEOUT_S overrides it).
GROUP_TIMEOUT_S = 300.0
_counters: dict[str, Any] = {}


def meeting(kind: str) -> str:
    """The next meeting point prefix of ``kind`` (``save``, ``restore``...), e.g. ``save/3``."""
    return f"{kind}/{next(_counters.setdefault(kind, itertools.count()))}"


def group_timeout() -> float:
    """The bound on one meeting point, in seconds: ``CANDLE_CKPT_GROUP_TIMEOUT_S`` or :data:`GROUP_TIMEOUT_S`."""
    raw = os.environ.get("CANDLE_CKPT_GROUP_TIMEOUT_S", "").strip()
    try:
        value = float(raw) if raw else GROUP_TIMEOUT_S
    except ValueError:
        raise ValueError(f"CANDLE_CKPT_GROUP_TIMEOUT_S must be a number of seconds > 0; got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"CANDLE_CKPT_GROUP_TIMEOUT_S must be a number of seconds > 0; got {raw!r}")
    return value


def failed_capture(err: BaseException) -> Capture:
    """The capture of a rank whose snapshot failed: its part raises ``err``, so every rank learns it in the commit."""

    def parts(work: str) -> None:
        raise err

    return Capture(files=[], model_file=MANIFEST, nbytes=0, parts=parts)


def _error_of(err: BaseException) -> str:
    return f"error:{type(err).__name__}: {err}"


def commit_parts(
    store: CheckpointStore,
    group: Group,
    parts: Callable[[str], Any],
    files: Iterable[FileSpec],
    template: Sidecar,
    on_complete: Callable[[int, Sidecar], None],
    sharding: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> Sidecar | None:
    """Commit one checkpoint that every rank of ``group`` writes a part of; call it on every rank.

    Args:
        store: The checkpoint store (open for writing on the primary).
        group: The job's processes.
        parts: ``parts(work_dir)`` writes this rank's part (see :func:`~candle_ckpt.storage.sharded.write_part`).
        files: The primary's own files (the model's config).
        template: The sidecar template (the primary's; ``model_file`` becomes ``manifest.json``).
        on_complete: ``on_complete(generation, sidecar)``: the primary's rename and links once ``work/`` is complete.
        sharding: Each variable's sharding as saved, by path (kept in the manifest).
        timeout_s: Bound on each meeting point (None: :func:`group_timeout`).

    Returns:
        The committed sidecar on the primary; None on the other ranks.

    Raises:
        CheckpointError: on every rank, if any rank failed (the message names it) or did not come in time.
    """
    name = meeting("save")
    timeout_s = group_timeout() if timeout_s is None else timeout_s
    lay, fs = store.layout, store.fs
    primary = group.rank == 0
    generation = 0
    said = None
    if primary:
        try:
            generation = store.take_generation("a multi-process commit")
            fresh_work(fs, lay)
            said = "ok"
        except Exception as err:
            said = _error_of(err)
    said = group.broadcast(f"{name}/work-ready", said, timeout_s)
    if said != "ok":
        raise CheckpointError(f"the primary could not start the checkpoint: {said[6:]}")
    start = time.perf_counter()
    failure = None
    try:
        parts(lay.work)
    except Exception as err:
        failure = err
    if not group.all_agree(f"{name}/parts-written", failure is None, timeout_s):
        if primary:
            discard_work(fs, lay)
        if failure is not None:
            raise CheckpointError(f"rank {group.rank} could not write its part: {failure}") from failure
        raise CheckpointError("another process could not write its part (see its log); nothing was committed")
    outcome, final = None, None
    if primary:
        try:
            final = _finish(store, group.size, generation, files, template, sharding, start)
            on_complete(generation, final)
            outcome = "ok"
        except Exception as err:
            discard_work(fs, lay)
            outcome = _error_of(err)
    outcome = group.broadcast(f"{name}/committed", outcome, timeout_s)
    if outcome != "ok":
        raise CheckpointError(f"the primary could not commit the checkpoint: {outcome[6:]}")
    return final


def _finish(
    store: CheckpointStore,
    count: int,
    generation: int,
    files: Iterable[FileSpec],
    template: Sidecar,
    sharding: dict[str, str] | None,
    start: float,
) -> Sidecar:
    """The primary's part of step 3: manifest (after checking all ``count`` parts), its files, the sidecar."""
    lay, fs = store.layout, store.fs
    manifest = write_manifest(lay.work, count, sharding, {}, fs=fs)
    entries = dict(manifest.files)
    entries.update(write_files(fs, lay, files, store.checksum))
    elapsed = max(time.perf_counter() - start, 1e-9)
    total = sum(e.size for e in entries.values())
    final = replace(
        template,
        model_file=MANIFEST,
        files=entries,
        generation=generation,
        save_duration_s=seconds(elapsed),
        save_mb_per_s=mb_per_s(total, elapsed),
    )
    fs.write_bytes(os.path.join(lay.work, L.SIDECAR), final.to_json())
    fs.fsync_dir(lay.work)
    return final


def publish_epoch(store: CheckpointStore, epoch: int, best_epoch: int | None) -> None:
    """Rename the complete ``work/`` to ``epochs/NNN`` and move the links, as a one-process commit does."""
    lay, fs = store.layout, store.fs
    old_links = {name: raw_link(lay, name) for name in L.LINK_NAMES}
    replaced = publish(fs, lay, epoch)
    try:
        store._move_links(epoch, best_epoch)
    except BaseException:
        unpublish(fs, lay, epoch, replaced, old_links)
        raise
    if replaced is not None:
        remove_trash(fs, replaced)


def commit_epoch(
    store: CheckpointStore, group: Group, epoch: int, cap: Any, template: Sidecar, best_epoch: int | None
) -> Sidecar | None:
    """Every rank writes its part of ``cap``; the primary commits ``epochs/NNN``. None on the other ranks."""
    if cap.parts is None:
        raise CheckpointError("a multi-process save needs a sharded capture (parts); this capture is one file set")

    def complete(generation: int, side: Sidecar) -> None:
        publish_epoch(store, epoch, best_epoch)

    return commit_parts(store, group, cap.parts, cap.files, replace(template, epoch=epoch), complete, cap.sharding)


def commit_step(store: CheckpointStore, group: Group, cap: Any, template: Sidecar) -> Sidecar | None:
    """A step checkpoint (``steps/GGG``) written by every rank; the primary renames it and removes older ones."""
    if cap.parts is None:
        raise CheckpointError("a multi-process save needs a sharded capture (parts); this capture is one file set")
    lay, fs = store.layout, store.fs

    def complete(generation: int, side: Sidecar) -> None:
        if not os.path.isdir(lay.steps):
            fs.makedirs(lay.steps, durable=True)
        fs.rename(lay.work, lay.step_dir(generation))
        fs.fsync_dir(lay.steps)
        store.steps._remove([g for g in store.steps.generations() if g != generation])

    return commit_parts(store, group, cap.parts, cap.files, template, complete, cap.sharding)
