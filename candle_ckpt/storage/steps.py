"""Step (mid-epoch) checkpoints: ``ckpts/steps/GGG``, beside ``epochs/NNN`` and never one of them.

A step checkpoint is what a preemption save (``ckpt_preempt_signals``,
``ckpt_deadline``) or ``ckpt_save_steps`` writes in the middle of an epoch.
``epochs/NNN``, ``best`` and ``last`` keep their CANDLE meaning: a step
checkpoint is never ``best`` nor ``last``, never pruned by the retention policy,
and named after its commit generation ``GGG`` (unique and increasing in the
store, shared with the epoch commits). Its sidecar's ``epoch`` is the number
of completed epochs and ``step`` the training steps done in the next one.

The commit protocol is the epoch commit's: every file into ``work/`` and
fsynced, the sidecar last, ``work/`` fsynced and renamed to ``steps/GGG``,
``steps/`` fsynced. Only then are older step checkpoints removed (renamed
into ``trash-*`` first), so one always exists from the first commit on. The
next epoch commit supersedes it: :meth:`StepCheckpoints.supersede` removes
every step checkpoint of an earlier epoch.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.commit import SharedCommit, discard_work, write_work

logger = logging.getLogger("candle_ckpt.storage.steps")


def list_steps(layout: L.Layout) -> list[int]:
    """Generations of the step checkpoints on disk, ascending (real directories named as numbers only)."""
    try:
        names = os.listdir(layout.steps)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        number = L.parse_epoch(name)
        path = os.path.join(layout.steps, name)
        if number is None or L.epoch_name(number) != name or os.path.islink(path) or not os.path.isdir(path):
            continue
        found.append(number)
    return sorted(found)


class StepCheckpoints:
    """The step checkpoints of one :class:`~candle_ckpt.storage.store.CheckpointStore`.

    Reading needs no lock; :meth:`commit`, :meth:`supersede` and
    :meth:`remove_all` need the store opened for writing.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.layout: L.Layout = store.layout

    def generations(self) -> list[int]:
        return list_steps(self.layout)

    def read_sidecar(self, generation: int) -> Sidecar:
        """Read and validate ``steps/GGG/ckpt-info.json``.

        Raises:
            CorruptCheckpoint: it is missing, invalid, or not the step checkpoint of that generation.
        """
        from candle_ckpt.storage.reader import L_MAX_READ

        path = os.path.join(self.layout.step_dir(generation), L.SIDECAR)
        try:
            with open(path, "rb") as f:
                raw = f.read(L_MAX_READ)
        except OSError as err:
            raise CorruptCheckpoint(path, f"sidecar cannot be read: {err}") from None
        try:
            side = Sidecar.from_json(raw, source=path)
        except CheckpointError as err:
            raise CorruptCheckpoint(path, str(err).removeprefix(path + ": ")) from None
        if side.step is None or side.generation != generation:
            raise CorruptCheckpoint(path, f"not the step checkpoint of generation {generation}")
        return side

    def verify(self, generation: int, *, reads: Iterable[str] = (), mapped: bool = False, progress=None):
        """``(sidecar, contents)`` after checking the size and CRC of every file (see ``CheckpointReader.verify``)."""
        side = self.read_sidecar(generation)
        contents = self.store.verify_files(
            self.layout.step_dir(generation), side, reads=reads, mapped=mapped, progress=progress
        )
        return side, contents

    def newest_valid(
        self,
        *,
        after: Sidecar | None,
        reads: Iterable[str] = (),
        mapped: bool = False,
        on_problem: Callable[[str, str], None] | None = None,
    ) -> tuple[Sidecar, dict[str, Any]] | None:
        """The newest verified step checkpoint committed after ``after`` (an epoch checkpoint's sidecar), or None.

        A step checkpoint older than ``after`` (lower generation, or an
        earlier epoch) is never chosen. Each rejected one is reported as
        ``on_problem(path, reason)``.
        """
        reads = tuple(reads)
        for generation in reversed(self.generations()):
            path = self.layout.step_dir(generation)
            if after is not None and generation <= after.generation:
                break
            try:
                side, contents = self.verify(generation, reads=reads, mapped=mapped)
            except CheckpointError as err:
                if on_problem is not None:
                    on_problem(path, str(err))
                continue
            if after is not None and side.epoch < after.epoch:
                continue
            return side, contents
        return None

    def commit(self, files: Iterable[Any], sidecar: Sidecar, *, shared: SharedCommit | None = None) -> Sidecar:
        """Write a step checkpoint atomically, then remove the older ones.

        Args:
            files: :class:`~candle_ckpt.storage.store.FileSpec` objects.
            sidecar: Template; ``epoch`` and ``step`` must be set, the rest is filled in here.
            shared: The primary's side of a multi-part commit
                (:class:`~candle_ckpt.storage.multipart.SharedSave`), as for an epoch commit.
        """
        store, lay, fs = self.store, self.layout, self.store.fs
        try:
            if sidecar.step is None:
                raise ValueError("a step checkpoint's sidecar needs its step")
            generation = store.take_generation("a step commit")
            final = write_work(fs, lay, files, store.checksum, sidecar, generation, shared)
            try:
                if not os.path.isdir(lay.steps):
                    fs.makedirs(lay.steps, durable=True)
                fs.rename(lay.work, lay.step_dir(generation))
                fs.fsync_dir(lay.steps)
            except BaseException:
                discard_work(fs, lay)
                raise
        except BaseException as err:
            if shared is not None:
                shared.failed(err)
            raise
        if shared is not None:
            shared.committed(L.step_name(generation))
        self._remove([g for g in self.generations() if g != generation])
        return final

    def supersede(self, epoch: int) -> list[int]:
        """After the commit of epoch checkpoint ``epoch``: remove the step checkpoints of earlier epochs.

        Unreadable ones go too (they could never be resumed from). Returns the generations removed.
        """
        doomed = []
        for generation in self.generations():
            try:
                if self.read_sidecar(generation).epoch >= epoch:
                    continue
            except CheckpointError:
                pass
            doomed.append(generation)
        self._remove(doomed)
        return doomed

    def remove_all(self) -> list[int]:
        """Remove every step checkpoint (a rollback abandons them); returns the generations removed."""
        doomed = self.generations()
        self._remove(doomed)
        return doomed

    def _remove(self, generations: list[int]) -> None:
        """Rename each into ``trash-*`` (never half-deleted under ``steps/``), fsync, then delete."""
        if not generations:
            return
        lay, fs = self.layout, self.store.fs
        trashed = []
        for generation in generations:
            trash = lay.trash_dir(f"step-{L.epoch_name(generation)}-{uuid.uuid4().hex[:8]}")
            fs.rename(lay.step_dir(generation), trash)
            trashed.append(trash)
        fs.fsync_dir(lay.steps)
        for trash in trashed:
            try:
                fs.rmtree(trash)
            except OSError as err:  # gone from steps/ already; trash-* is removed at the next start
                logger.warning("could not remove %s now (it goes at the next start): %s", trash, err)
