"""The checkpoint store: the write side (commit, links, delete, prune) over :class:`CheckpointReader`.

:meth:`CheckpointStore.commit` runs the commit protocol of
:mod:`candle_ckpt.storage.commit` (write into ``work/``, rename to
``epochs/NNN``, move the links; each step durable and undone on failure).

A crash at any instant leaves either the old state or the new one; leftovers
(``work/``, ``trash-*``, ``.tmp-*``) are never read and are removed by the
next writer. Readers trust nothing: sidecars are validated, links are only
followed in the exact form ``epochs/NNN``, and every CRC is checked before
anything is loaded.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.retention import prune_plan
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.commit import (
    FileSpec,
    SharedCommit,
    publish,
    raw_link,
    remove_trash,
    unpublish,
    write_work,
)
from candle_ckpt.storage.lineage import LineageBest, abandoned_epochs, lineage_best, readable_sidecars
from candle_ckpt.storage.lock import WriterLock
from candle_ckpt.storage.reader import CheckpointReader
from candle_ckpt.storage.steps import StepCheckpoints, list_steps

if TYPE_CHECKING:
    from candle_ckpt.config.params import CkptConfig

logger = logging.getLogger("candle_ckpt.storage.store")


class CheckpointStore(CheckpointReader):
    """One checkpoint directory.

    Reading (listing, verifying, finding a restart point) needs no lock.
    Writing needs :meth:`open_for_write`, which takes the writer lock, removes a
    crashed writer's leftovers and learns the next commit generation.

    Its arguments are :class:`CheckpointReader`'s (``directory``, ``fs``, ``checksum``, ``flat``).
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, fs: LocalFS | None = None, checksum: bool = True, flat: bool = False
    ) -> None:
        super().__init__(directory, fs=fs, checksum=checksum, flat=flat)
        self._generation: int | None = None
        self._lock = WriterLock(self.layout.lock)
        self._released_by = ""  # who last released the lock: named when a commit then finds it gone
        self.steps = StepCheckpoints(self)  # ckpts/steps/GGG: mid-epoch checkpoints (see storage.steps)

    @classmethod
    def of(cls, cfg: CkptConfig, *, fs: LocalFS | None = None) -> CheckpointStore:
        """The store of a job's configuration: its ``ckpt_directory`` in its ``ckpt_layout``, checksummed as
        ``ckpt_checksum`` says (as :meth:`Layout.of <candle_ckpt.core.layout.Layout.of>` gives its paths)."""
        return cls(cfg.directory, fs=fs, checksum=cfg.checksum, flat=cfg.flat)

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        """True while this store holds the writer lock (between open_for_write and close)."""
        return self._lock.held

    # -- writer side -------------------------------------------------------------
    def open_for_write(self) -> None:
        """Lock the directory for writing and clean a crashed writer's debris (no-op if open).

        The first time, the layout is created and checked for writability, so a
        bad ``ckpt_directory`` fails now and not at epoch 50. Opening again after
        :meth:`close` (a second ``fit``) does not repeat the write probe: a disk
        that filled up meanwhile fails the next save, as ``ckpt_on_error`` says.
        """
        if self._lock.held:
            return
        if self._generation is None or not os.path.isdir(self.layout.epochs):
            self._prepare()
        self._lock.acquire()
        try:
            self.clean_debris()
            # Another writer may have committed while this store was closed: continue after it.
            self._generation = max(self._generation or 0, self._max_generation() + 1)
        except BaseException:
            self._lock.release()
            raise

    def _prepare(self) -> None:
        """Create the layout and check that this process can write into it."""
        lay = self.layout
        self.check_layout()
        try:
            # Through the fs and durable: without an fsync of their parents a power cut
            # after the first commit returned could lose ckpts/ or epochs/ themselves.
            self.fs.makedirs(lay.epochs, durable=True)
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and os.path.isdir(lay.root):
                # It exists: the cause is that it cannot be written, not that it cannot be created.
                raise PermissionError(
                    err.errno, f"ckpt_directory {lay.root!r} is not writable by this process ({err.strerror})"
                ) from None
            raise OSError(err.errno, f"ckpt_directory {lay.root!r} cannot be created: {err.strerror}") from None
        if not os.access(lay.ckpts, os.W_OK | os.X_OK) or not os.access(lay.epochs, os.W_OK | os.X_OK):
            raise PermissionError(f"ckpt_directory {lay.root!r} is not writable by this process")
        probe = os.path.join(lay.ckpts, f".tmp-probe-{uuid.uuid4().hex[:8]}")
        try:
            with open(probe, "wb") as f:
                f.write(b"x")
            os.unlink(probe)
        except OSError as err:
            raise OSError(err.errno, f"ckpt_directory {lay.root!r} is not writable: {err.strerror}") from None

    def resync_generation(self) -> None:
        """Continue after commits made here by another store object of this
        process since :meth:`open_for_write` (a pull from the remote copy)."""
        if self._generation is not None:
            self._generation = max(self._generation, self._max_generation() + 1)

    def continue_at(self, generation: int) -> None:
        """The next commit takes at least ``generation`` (a checkpoint pulled from the persistent tier keeps its
        place in the lineage, so later work always has a higher generation than it)."""
        if self._generation is not None:
            self._generation = max(self._generation, generation)

    def use_generation(self, generation: int) -> None:
        """The next commit takes exactly ``generation``: a process of a node-local job commits its copy of a
        checkpoint under the primary's generation (:mod:`candle_ckpt.storage.multipart`)."""
        if self._generation is not None:
            self._generation = generation

    def close(self) -> None:
        """Release the writer lock this store holds (no-op if it holds none).

        A closed store can still be read, and :meth:`open_for_write` opens it again.
        """
        if self._lock.held:
            self._released_by = _release_site()
        self._lock.release()

    def clean_debris(self) -> list[str]:
        """Remove what a crashed writer left behind; return the names removed."""
        removed = []
        for name in sorted(os.listdir(self.layout.ckpts)):
            if self.layout.is_debris(name):
                path = os.path.join(self.layout.ckpts, name)
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        self.fs.rmtree(path)
                    else:
                        self.fs.unlink(path)
                except OSError as err:  # debris is never read; a leftover costs disk space only
                    logger.warning("could not remove leftover %s (restart ignores it): %s", path, err)
                    continue
                removed.append(name)
        if removed:
            self.fs.fsync_dir(self.layout.ckpts)
            logger.info("removed leftovers of an interrupted save: %s", ", ".join(removed))
        return removed

    def _max_generation(self) -> int:
        best = max(list_steps(self.layout), default=0)  # a step checkpoint is named after its generation
        for epoch in self.epochs():
            try:
                best = max(best, self.read_sidecar(epoch).generation)
            except CheckpointError:
                continue
        return best

    def take_generation(self, what: str) -> int:
        """The generation of the commit about to start (epoch or step checkpoint); the next one is one more.

        A generation is never reused, even by a commit that fails half-way.

        Raises:
            CheckpointError: the store is not open for writing (``what`` names the commit).
        """
        if not self._lock.held or self._generation is None:
            why = f" (the writer lock was released by {self._released_by})" if self._released_by else ""
            raise CheckpointError(f"{self.layout.root}: open_for_write() must be called before {what}{why}")
        generation = self._generation
        self._generation += 1
        return generation

    def commit(
        self,
        epoch: int,
        files: Iterable[FileSpec],
        sidecar: Sidecar,
        *,
        best_epoch: int | None = None,
        shared: SharedCommit | None = None,
    ) -> Sidecar:
        """Write a checkpoint for ``epoch`` atomically and move the links.

        Args:
            epoch: Number of completed epochs; the directory is ``epochs/NNN``.
            files: The files to write; ``sidecar.model_file`` must be one of them.
            sidecar: Template sidecar; ``files``, ``generation`` and the save
                statistics are filled in here.
            best_epoch: Where ``best`` must point after this commit (None: leave it).
            shared: In a job of several processes, the primary's side of the
                multi-part commit (:mod:`candle_ckpt.storage.multipart`): the
                other ranks' parts are checked and listed, and every rank hears
                the outcome, success or failure.

        Returns:
            The sidecar as written.
        """
        lay, fs = self.layout, self.fs
        try:
            generation = self.take_generation("commit()")
            final = write_work(fs, lay, files, self.checksum, replace(sidecar, epoch=epoch), generation, shared)
            # From here on a failure (an fsync error above all) withdraws the new
            # checkpoint and puts the links back: a failed save changes nothing that
            # restart() would pick, and an fsync that failed is never trusted later.
            old_links = {name: raw_link(lay, name) for name in L.LINK_NAMES}
            replaced = publish(fs, lay, epoch)
            try:
                self._move_links(epoch, best_epoch)
            except BaseException:
                unpublish(fs, lay, epoch, replaced, old_links)
                raise
        except BaseException as err:
            if shared is not None:
                shared.failed(err)
            raise
        if shared is not None:
            shared.committed(L.link_target(epoch))
        if replaced is not None:
            remove_trash(fs, replaced)
        return final

    def _move_links(self, epoch: int, best_epoch: int | None) -> None:
        """Point ``last`` at ``epoch``, and ``best`` at ``best_epoch`` if given, moved and present (step 4)."""
        self.set_link("last", epoch)
        if (
            best_epoch is not None
            and self.link_epoch("best") != best_epoch
            and os.path.isdir(self.layout.epoch_dir(best_epoch))
        ):
            self.set_link("best", best_epoch)

    def set_link(self, name: str, epoch: int) -> None:
        """Atomically point ``best``/``last`` at ``epochs/NNN`` (which must exist)."""
        if not os.path.isdir(self.layout.epoch_dir(epoch)):
            raise CheckpointError(f"cannot point {name!r} at missing {self.layout.epoch_dir(epoch)}")
        self.fs.set_link(self.layout.link(name), L.link_target(epoch))

    def delete(self, epoch: int) -> None:
        """Delete ``epochs/NNN``: rename it to ``trash-*`` first, so no half-deleted
        directory is ever visible under ``epochs/``."""
        lay = self.layout
        trash = lay.trash_dir(f"{L.epoch_name(epoch)}-{uuid.uuid4().hex[:8]}")
        self.fs.rename(lay.epoch_dir(epoch), trash)
        self.fs.fsync_dir(lay.epochs)
        remove_trash(self.fs, trash)  # the epoch is already gone from epochs/

    def prune(
        self,
        select: Callable[[list[int], set[int]], set[int]],
        protected: Iterable[int] = (),
        *,
        lineage_first: bool = True,
    ) -> list[int]:
        """Delete the checkpoints that ``select(epochs, protected)`` does not keep.

        ``best``, ``last`` and ``protected`` are always kept, whatever
        ``select`` returns. Covers every checkpoint in the directory, including
        those of earlier runs of the same job; after a rollback the current
        lineage is retained first (:meth:`prune_plan`).

        Returns:
            The epochs deleted.
        """
        _, doomed = self.prune_plan(select, protected, lineage_first=lineage_first)
        for epoch in doomed:
            self.delete(epoch)
        return doomed

    def prune_plan(
        self,
        select: Callable[[list[int], set[int]], set[int]],
        protected: Iterable[int] = (),
        *,
        lineage_first: bool = True,
    ) -> tuple[list[int], list[int]]:
        """Return ``(keep, delete)``, both ascending: what :meth:`prune` would do, without doing it.

        ``best``, ``last`` and ``protected`` are always in ``keep``.

        The current lineage is retained first: the checkpoints a rollback abandoned rank as older than
        every one of it (:func:`~candle_ckpt.core.retention.prune_plan`). The sidecars that tell them apart are
        read only when something is to go. ``lineage_first=False``: ``select`` sees the epochs as they are (a rule
        that is about the lineage itself, as ``prune --abandoned``).
        """
        links = (self.link_epoch("best"), self.link_epoch("last"))
        epochs, kept = self.epochs(), [e for e in (*links, *protected) if e is not None]
        keep, doomed = prune_plan(epochs, select, kept)
        if not doomed or not lineage_first:
            return keep, doomed
        return prune_plan(epochs, select, kept, abandoned_epochs(self, links[1]))

    def rollback(self, epoch: int) -> Rollback:
        """Make ``epoch`` the one the next restart resumes from; the store must be open for writing.

        ``epoch`` is verified first (a :class:`CheckpointError` leaves everything as it was). Then ``last``
        points to it; ``best``, if there is one, moves to the best checkpoint of the lineage that now leads
        to ``last`` (:func:`~candle_ckpt.storage.lineage.lineage_best`), or is removed if no checkpoint of it
        records the monitored metric; and the step checkpoints, which continue the run rolled back from, are
        removed. The later epochs stay on disk, as a lineage the rollback abandoned.
        """
        if not self.is_open:
            raise CheckpointError(f"{self.layout.root}: open_for_write() must be called before rollback()")
        self.verify(epoch)
        before = self.link_epoch("last")
        had_best = os.path.lexists(self.layout.link("best"))
        best_before = self.link_epoch("best") if had_best else None
        self.set_link("last", epoch)
        best = lineage_best(readable_sidecars(self), epoch)
        if had_best and best.epoch is None:
            self.remove_link("best")
        elif had_best and best.epoch != best_before:
            self.set_link("best", best.epoch)
        dropped = self.steps.remove_all()
        return Rollback(epoch, before, had_best, best_before, best, dropped)

    def remove_link(self, name: str) -> None:
        """Remove the ``best``/``last`` link (or pointer file) durably; no-op if there is none."""
        path = self.layout.link(name)
        if os.path.lexists(path):
            self.fs.unlink(path)
            self.fs.fsync_dir(self.layout.ckpts)


@dataclass(frozen=True)
class Rollback:
    """What :meth:`CheckpointStore.rollback` changed."""

    epoch: int  # where last points now
    last_before: int | None
    had_best: bool  # there was a best link (moved, kept or removed); without one, best is left absent
    best_before: int | None
    best: LineageBest  # best.epoch: where best points now (None: removed, or never there)
    dropped: list[int]  # the generations of the step checkpoints removed


def _release_site() -> str:
    """The thread and the calls that release a lock, innermost first (issue 27: a lock released in the middle of a
    fit, cause unconfirmed: the next occurrence names its releaser)."""
    calls = traceback.extract_stack()[-8:-2]
    where = " < ".join(f"{os.path.basename(c.filename)}:{c.lineno} {c.name}" for c in reversed(calls))
    return f"thread {threading.current_thread().name}: {where}"
