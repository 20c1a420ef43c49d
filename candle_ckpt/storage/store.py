"""The checkpoint store: the write side (commit, links, delete, prune) over :class:`CheckpointReader`.

The commit protocol (every step goes through :class:`~candle_ckpt.core.fs.LocalFS`):

1. write every file into ``ckpts/work/`` and fsync it (its CRC32 is computed
   while it is written), then write ``ckpt-info.json`` last and fsync it;
2. fsync ``work/``;
3. rename ``work/`` to ``epochs/NNN`` and fsync ``epochs/``; an existing
   ``epochs/NNN`` (from a rolled-back lineage) is first renamed aside into
   ``trash-*`` only now that the new one is complete, and removed afterwards;
4. move ``last`` (and ``best``) with a temporary symlink ``os.replace``-d over
   the old one, fsyncing ``ckpts/``;
5. prune (the callers do this after the commit).

If any step fails (an fsync returning EIO included), the commit raises and
undoes itself: ``work/`` is removed, a renamed ``epochs/NNN`` is withdrawn
into ``trash-*``, and ``last``/``best`` are put back. A failed fsync is never
retried as if it had succeeded (the PostgreSQL "fsyncgate" lesson): the next
save writes every file anew.

A crash at any instant leaves either the old state or the new one; leftovers
(``work/``, ``trash-*``, ``.tmp-*``) are never read and are removed by the
next writer. Readers trust nothing: sidecars are validated, links are only
followed in the exact form ``epochs/NNN``, and every CRC is checked before
anything is loaded.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from candle_ckpt.core import layout as L
from candle_ckpt.core.checksum import CrcFile, format_crc
from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.fs import LocalFS, read_link
from candle_ckpt.core.keep import prune_plan
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.lock import WriterLock
from candle_ckpt.storage.reader import CheckpointReader
from candle_ckpt.storage.steps import StepCheckpoints, list_steps

logger = logging.getLogger("candle_ckpt.storage.store")


@dataclass(frozen=True)
class FileSpec:
    """One file of a checkpoint: its name and a function that writes it."""

    name: str
    write: Callable[[CrcFile], None]


class CheckpointStore(CheckpointReader):
    """One checkpoint directory.

    Reading (listing, verifying, finding a restart point) needs no lock.
    Writing needs :meth:`open_for_write`, which takes the writer lock, removes a
    crashed writer's leftovers and learns the next commit generation.

    Args:
        directory: ``ckpt_directory``; the store lives in ``<directory>/ckpts``.
        fs: The file-system operations (tests inject faults here).
        checksum: Compute and check CRC32s (``ckpt_checksum``).
        flat: The ``flat`` layout (no ``ckpts/`` level; ``ckpt_layout``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fs: LocalFS | None = None,
        checksum: bool = True,
        flat: bool = False,
    ) -> None:
        super().__init__(directory, fs=fs, checksum=checksum, flat=flat)
        self._generation: int | None = None
        self._lock = WriterLock(self.layout.lock)
        self.steps = StepCheckpoints(self)  # ckpts/steps/GGG: mid-epoch checkpoints (see storage.steps)

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

    def close(self) -> None:
        """Release the writer lock this store holds (no-op if it holds none).

        A closed store can still be read, and :meth:`open_for_write` opens it again.
        """
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

    def commit(
        self, epoch: int, files: Iterable[FileSpec], sidecar: Sidecar, *, best_epoch: int | None = None
    ) -> Sidecar:
        """Write a checkpoint for ``epoch`` atomically and move the links.

        Args:
            epoch: Number of completed epochs; the directory is ``epochs/NNN``.
            files: The files to write; ``sidecar.model_file`` must be one of them.
            sidecar: Template sidecar; ``files``, ``generation`` and the save
                statistics are filled in here.
            best_epoch: Where ``best`` must point after this commit (None: leave it).

        Returns:
            The sidecar as written.
        """
        if not self._lock.held or self._generation is None:
            raise CheckpointError(f"{self.layout.root}: open_for_write() must be called before commit()")
        lay, fs = self.layout, self.fs
        start = time.perf_counter()
        # A generation is never reused, even by a commit that fails half-way.
        generation = self._generation
        self._generation += 1
        if os.path.lexists(lay.work):
            fs.rmtree(lay.work)
        fs.makedirs(lay.work)
        try:
            entries = {}
            for spec in files:
                if not L.is_safe_filename(spec.name) or spec.name == L.SIDECAR:
                    raise ValueError(f"checkpoint file name {spec.name!r} is not allowed")
                entries[spec.name] = self._write_file(os.path.join(lay.work, spec.name), spec.write)
            elapsed = max(time.perf_counter() - start, 1e-9)
            total = sum(e.size for e in entries.values())
            final = replace(
                sidecar,
                epoch=epoch,
                files=entries,
                generation=generation,
                save_duration_s=round(elapsed, 6),
                save_mb_per_s=round(total / elapsed / 1e6, 3),
            )
            fs.write_bytes(os.path.join(lay.work, L.SIDECAR), final.to_json())
            fs.fsync_dir(lay.work)
        except BaseException:
            self._discard_work()
            raise
        # From here on a failure (an fsync error above all) withdraws the new
        # checkpoint and puts the links back: a failed save changes nothing that
        # restart() would pick, and an fsync that failed is never trusted later.
        old_links = {name: self._raw_link(name) for name in L.LINK_NAMES}
        replaced = self._publish(epoch)
        try:
            self.set_link("last", epoch)
            if (
                best_epoch is not None
                and self.link_epoch("best") != best_epoch
                and os.path.isdir(lay.epoch_dir(best_epoch))
            ):
                self.set_link("best", best_epoch)
        except BaseException:
            self._unpublish(epoch, replaced, old_links)
            raise
        if replaced is not None:
            try:
                fs.rmtree(replaced)
            except OSError as err:  # the commit is durable; trash-* is removed at the next start
                logger.warning("could not remove %s now (it goes at the next start): %s", replaced, err)
        return final

    def _write_file(self, path: str, write: Callable[[CrcFile], None]):
        from candle_ckpt.core.sidecar import FileEntry

        f = self.fs.create(path)
        try:
            write(f)
            if f.write_error is not None:  # the writer swallowed a failed write: the file is incomplete
                raise f.write_error
            value = format_crc(f.crc32()) if self.checksum else None
            f.close()
        except BaseException as err:
            f.abort()
            if f.write_error is not None and err is not f.write_error:
                # e.g. h5py's "Problems closing file": say what really happened (ENOSPC, EIO).
                raise f.write_error from err
            raise
        return FileEntry(f.size, value)

    def _publish(self, epoch: int) -> str | None:
        """Rename ``work/`` to ``epochs/NNN`` durably; return where an old ``epochs/NNN`` was moved.

        On failure ``work/`` is discarded and an old ``epochs/NNN`` is put back.
        """
        lay, fs = self.layout, self.fs
        target = lay.epoch_dir(epoch)
        replaced = None
        try:
            if os.path.lexists(target):
                # Replace only now that the new one is complete: move the old aside.
                replaced = lay.trash_dir(f"{L.epoch_name(epoch)}-{uuid.uuid4().hex[:8]}")
                fs.rename(target, replaced)
            fs.rename(lay.work, target)
        except BaseException:
            self._discard_work()
            self._unpublish(epoch, replaced, None, withdraw=False)
            raise
        try:
            fs.fsync_dir(lay.epochs)
            if replaced is not None:
                fs.fsync_dir(lay.ckpts)
        except BaseException:
            self._unpublish(epoch, replaced, None)
            raise
        return replaced

    def _unpublish(
        self, epoch: int, replaced: str | None, old_links: dict[str, str | None] | None, *, withdraw: bool = True
    ) -> None:
        """Undo a failed commit, best effort: withdraw ``epochs/NNN``, restore what it replaced and the links.

        Errors here are logged, never raised: the caller re-raises the original error.
        """
        lay, fs = self.layout, self.fs
        target = lay.epoch_dir(epoch)
        try:
            if withdraw and os.path.isdir(target):
                trash = lay.trash_dir(f"{L.epoch_name(epoch)}-failed-{uuid.uuid4().hex[:8]}")
                fs.rename(target, trash)
                if replaced is not None:
                    fs.rename(replaced, target)
                fs.fsync_dir(lay.epochs)
                fs.rmtree(trash)
            elif replaced is not None and not os.path.lexists(target):
                fs.rename(replaced, target)
                fs.fsync_dir(lay.epochs)
            for name, old in (old_links or {}).items():
                if self._raw_link(name) == old:
                    continue
                if old is None:
                    fs.unlink(lay.link(name))
                    fs.fsync_dir(lay.ckpts)
                else:
                    fs.set_link(lay.link(name), old)
        except Exception:
            logger.exception("could not fully undo the failed commit of %s", target)

    def _raw_link(self, name: str) -> str | None:
        try:
            return read_link(self.layout.link(name))
        except (OSError, ValueError):
            return None

    def _discard_work(self) -> None:
        try:
            if os.path.lexists(self.layout.work):
                self.fs.rmtree(self.layout.work)
        except Exception:  # the original error matters more than the cleanup
            logger.exception("could not remove %s after a failed save", self.layout.work)

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
        try:
            self.fs.rmtree(trash)
        except OSError as err:  # the epoch is already gone from epochs/; trash-* goes at the next start
            logger.warning("could not remove %s now (it goes at the next start): %s", trash, err)

    def prune(self, select: Callable[[list[int], set[int]], set[int]], protected: Iterable[int] = ()) -> list[int]:
        """Delete the checkpoints that ``select(epochs, protected)`` does not keep.

        ``best``, ``last`` and ``protected`` are always kept, whatever
        ``select`` returns. Covers every checkpoint in the directory, including
        those of earlier runs of the same job.

        Returns:
            The epochs deleted.
        """
        _, doomed = self.prune_plan(select, protected)
        for epoch in doomed:
            self.delete(epoch)
        return doomed

    def prune_plan(
        self, select: Callable[[list[int], set[int]], set[int]], protected: Iterable[int] = ()
    ) -> tuple[list[int], list[int]]:
        """Return ``(keep, delete)``, both ascending: what :meth:`prune` would do, without doing it.

        ``best``, ``last`` and ``protected`` are always in ``keep``.
        """
        links = (self.link_epoch("best"), self.link_epoch("last"))
        return prune_plan(self.epochs(), select, [e for e in (*links, *protected) if e is not None])
