"""The steps of the commit protocol, each durable and each undone on failure.

Every step goes through :class:`~candle_ckpt.core.fs.LocalFS`:

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
save writes every file anew. :meth:`CheckpointStore.commit
<candle_ckpt.storage.store.CheckpointStore.commit>` runs these steps in order.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from candle_ckpt.core import layout as L
from candle_ckpt.core.checksum import CrcFile, format_crc
from candle_ckpt.core.fs import LocalFS, read_link
from candle_ckpt.core.log import mb_per_s, seconds
from candle_ckpt.core.sidecar import FileEntry, Sidecar

logger = logging.getLogger("candle_ckpt.storage.commit")


@dataclass(frozen=True)
class FileSpec:
    """One file of a checkpoint: its name and a function that writes it."""

    name: str
    write: Callable[[CrcFile], None]


class SharedCommit(Protocol):
    """One process's side of a commit that several processes write together, as the commit protocol sees it.

    :class:`~candle_ckpt.storage.multipart.SharedSave` (the primary's) and
    :class:`~candle_ckpt.storage.multipart.NodePart` (a node-local rank's) implement it; this module never
    imports them, so the storage modules form no import circle (tests/unit/test_architecture.py).
    """

    def work_ready(self, work: str, generation: int) -> None:
        """A fresh ``work/`` exists for the commit of ``generation``: the other ranks may write into it."""
        ...

    def gather(self, fs: LocalFS, work: str, template: Sidecar | None = None) -> dict[str, FileEntry]:
        """The other ranks' files in ``work/``, checked, by name (added to the sidecar)."""
        ...

    def finish_sidecar(self, side: Sidecar) -> Sidecar:
        """The sidecar to write, with what the shared save adds to it."""
        ...

    def committed(self, where: str) -> None:
        """The checkpoint was published as ``where`` (``epochs/NNN`` or ``steps/GGG``)."""
        ...

    def failed(self, err: BaseException) -> None:
        """The commit failed with ``err``: no rank may wait for it."""
        ...


def fresh_work(fs: LocalFS, lay: L.Layout) -> None:
    """Start an empty ``work/``, removing what a failed save left there."""
    if os.path.lexists(lay.work):
        fs.rmtree(lay.work)
    fs.makedirs(lay.work)


def write_work(
    fs: LocalFS,
    lay: L.Layout,
    files: Iterable[FileSpec],
    checksum: bool,
    sidecar: Sidecar,
    generation: int,
    shared: SharedCommit | None = None,
) -> Sidecar:
    """Step 1 of a commit: every file, then the sidecar, into a fresh ``work/``, fsynced; ``work/`` fsynced.

    With ``shared`` (a job of several processes, see
    :mod:`candle_ckpt.storage.multipart`), the other ranks write their parts
    into the same ``work/`` meanwhile; the primary checks them all and adds
    them and ``manifest.json`` to the sidecar before writing it.

    Returns the sidecar as written (``sidecar`` with its files, generation and
    save timings). On any failure ``work/`` is removed and the error raised.
    """
    start = time.perf_counter()
    fresh_work(fs, lay)
    try:
        if shared is not None:
            shared.work_ready(lay.work, generation)
        entries = write_files(fs, lay, files, checksum)
        if shared is not None:
            entries.update(shared.gather(fs, lay.work, sidecar))
        elapsed = max(time.perf_counter() - start, 1e-9)
        total = sum(e.size for e in entries.values())
        final = replace(
            sidecar,
            files=entries,
            generation=generation,
            save_duration_s=seconds(elapsed),
            save_mb_per_s=mb_per_s(total, elapsed),
        )
        if shared is not None:  # a node-local job's copy says so (storage.multipart)
            final = shared.finish_sidecar(final)
        fs.write_bytes(os.path.join(lay.work, L.SIDECAR), final.to_json())
        fs.fsync_dir(lay.work)
    except BaseException:
        discard_work(fs, lay)
        raise
    return final


def write_files(fs: LocalFS, lay: L.Layout, files: Iterable[FileSpec], checksum: bool) -> dict[str, FileEntry]:
    """Write and fsync each file into ``work/``; return its size and CRC32 by name (step 1)."""
    entries = {}
    for spec in files:
        if not L.is_safe_filename(spec.name) or spec.name == L.SIDECAR:
            raise ValueError(f"checkpoint file name {spec.name!r} is not allowed")
        entries[spec.name] = write_file(fs, os.path.join(lay.work, spec.name), spec.write, checksum)
    return entries


def write_file(fs: LocalFS, path: str, write: Callable[[CrcFile], None], checksum: bool) -> FileEntry:
    """Write one file through ``write`` and fsync it; a write the writer swallowed still fails here."""
    f = fs.create(path)
    try:
        write(f)
        if f.write_error is not None:  # the writer swallowed a failed write: the file is incomplete
            raise f.write_error
        value = format_crc(f.crc32()) if checksum else None
        f.close()
    except BaseException as err:
        f.abort()
        if f.write_error is not None and err is not f.write_error:
            # e.g. h5py's "Problems closing file": say what really happened (ENOSPC, EIO).
            raise f.write_error from err
        raise
    return FileEntry(f.size, value)


def publish(fs: LocalFS, lay: L.Layout, epoch: int) -> str | None:
    """Rename ``work/`` to ``epochs/NNN`` durably; return where an old ``epochs/NNN`` was moved (step 3).

    On failure ``work/`` is discarded and an old ``epochs/NNN`` is put back.
    """
    target = lay.epoch_dir(epoch)
    replaced = None
    try:
        if os.path.lexists(target):
            # Replace only now that the new one is complete: move the old aside.
            replaced = lay.trash_dir(f"{L.epoch_name(epoch)}-{uuid.uuid4().hex[:8]}")
            fs.rename(target, replaced)
        fs.rename(lay.work, target)
    except BaseException:
        discard_work(fs, lay)
        unpublish(fs, lay, epoch, replaced, None, withdraw=False)
        raise
    try:
        fs.fsync_dir(lay.epochs)
        if replaced is not None:
            fs.fsync_dir(lay.ckpts)
    except BaseException:
        unpublish(fs, lay, epoch, replaced, None)
        raise
    return replaced


def unpublish(
    fs: LocalFS,
    lay: L.Layout,
    epoch: int,
    replaced: str | None,
    old_links: dict[str, str | None] | None,
    *,
    withdraw: bool = True,
) -> None:
    """Undo a failed commit, best effort: withdraw ``epochs/NNN``, restore what it replaced and the links.

    Errors here are logged, never raised: the caller re-raises the original error.
    """
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
            if raw_link(lay, name) == old:
                continue
            if old is None:
                fs.unlink(lay.link(name))
                fs.fsync_dir(lay.ckpts)
            else:
                fs.set_link(lay.link(name), old)
    except Exception:
        logger.exception("could not fully undo the failed commit of %s", target)


def raw_link(lay: L.Layout, name: str) -> str | None:
    """The target of link ``name`` as written, or None if it is missing or unreadable."""
    try:
        return read_link(lay.link(name))
    except (OSError, ValueError):
        return None


def discard_work(fs: LocalFS, lay: L.Layout) -> None:
    """Remove ``work/`` after a failed save, best effort (the original error matters more)."""
    try:
        if os.path.lexists(lay.work):
            fs.rmtree(lay.work)
    except Exception:  # the original error matters more than the cleanup
        logger.exception("could not remove %s after a failed save", lay.work)


def remove_trash(fs: LocalFS, path: str) -> None:
    """Remove a ``trash-*`` directory now, or leave it to the next writer's start."""
    try:
        fs.rmtree(path)
    except OSError as err:  # the commit is durable; trash-* is removed at the next start
        logger.warning("could not remove %s now (it goes at the next start): %s", path, err)
