"""The read side of a checkpoint directory: list, validate, verify, find a restart point.

Reading needs no lock and trusts nothing: sidecars are validated, links are
followed only into ``epochs/NNN``, and every CRC is checked before anything is
loaded. :class:`~candle_ckpt.storage.store.CheckpointStore` adds the write side.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from collections.abc import Callable, Iterable, Iterator

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint, LayoutMismatch, SidecarError
from candle_ckpt.core.fs import LocalFS, read_link
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.filecheck import Prefetch, verify_file

logger = logging.getLogger("candle_ckpt.storage.reader")


class CheckpointReader:
    """The read side of one checkpoint directory (see :class:`~candle_ckpt.storage.store.CheckpointStore`).

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
        self.layout = L.Layout.at(directory, flat=flat)
        self.fs = fs or LocalFS()
        self.checksum = checksum
        # crc_scope(directory, sidecar): the names whose CRC32 a verification checks (None: all); the others
        # get their size checked. It may raise CheckpointError to reject the checkpoint. A process of a
        # multi-process job checks the CRC of the files it reads (see engine/group_restore.py).
        self.crc_scope: Callable[[str, Sidecar], Iterable[str] | None] | None = None
        # keep_scope(directory, sidecar): the names a verification reads whole into memory and returns with the
        # ``reads`` (never mapped): the part a process of a multi-process job loads from, read once for its CRC
        # and its values (one read of the file, not a check and then a copy out of a mapping).
        self.keep_scope: Callable[[str, Sidecar], Iterable[str]] | None = None
        self.prefetched: Prefetch | None = None  # files read ahead, taken by the verification of those it keeps

    def check_layout(self) -> None:
        """Refuse a directory that holds checkpoints in the other layout: the two are never mixed.

        Raises:
            LayoutMismatch: naming the directory, what it holds and what to set instead.
        """
        lay, other = self.layout, self.layout.other
        if os.path.isdir(lay.epochs) or not os.path.isdir(other.epochs) or os.path.islink(other.epochs):
            return
        if lay.flat:
            hint = f"set ckpt_directory to {other.ckpts!r} (or ckpt_layout='nested') to continue them"
        else:
            hint = "set ckpt_layout='flat' to continue them, or use another ckpt_directory"
        raise LayoutMismatch(
            f"ckpt_directory {lay.root!r} holds checkpoints in the {other.name} layout ({other.epochs}) but this job "
            f"uses the {lay.name} layout ({lay.epochs}); the two are never mixed in one directory: {hint}"
        )

    def exists(self) -> bool:
        return os.path.isdir(self.layout.epochs)

    def epochs(self) -> list[int]:
        """Committed epoch numbers, ascending.

        Names that are not numbers are ignored, and so is anything that is not
        a real directory: a symlink named like an epoch could lead outside.
        """
        try:
            names = os.listdir(self.layout.epochs)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            epoch = L.parse_epoch(name)
            if epoch is None or L.epoch_name(epoch) != name:
                continue
            path = os.path.join(self.layout.epochs, name)
            if os.path.islink(path) or not os.path.isdir(path):
                logger.warning("ignoring %s: not a directory (a symlink is never followed)", path)
                continue
            found.append(epoch)
        return sorted(found)

    def link_epoch(self, name: str) -> int | None:
        """The epoch ``best``/``last`` points to, or None if absent or unsafe."""
        try:
            target = read_link(self.layout.link(name))
        except (OSError, ValueError) as err:
            logger.warning("ignoring %s: %s", self.layout.link(name), err)
            return None
        if target is None:
            return None
        epoch, why = L.resolve_link_target(target, self._ckpts_spellings())
        if epoch is None:
            logger.warning("ignoring %s: %s", self.layout.link(name), why)
        return epoch

    def _ckpts_spellings(self) -> tuple[str, ...]:
        """The directory holding ``epochs/`` as configured and as its real path (CANDLE links the latter)."""
        given = os.path.normpath(self.layout.ckpts)
        real = os.path.realpath(given)
        return (given,) if real == given else (given, real)

    def read_sidecar(self, epoch: int) -> Sidecar:
        """Read and validate ``epochs/NNN/ckpt-info.json``."""
        path = os.path.join(self.layout.epoch_dir(epoch), L.SIDECAR)
        try:
            with open(path, "rb") as f:
                raw = f.read(L_MAX_READ)
        except FileNotFoundError:
            raise CorruptCheckpoint(path, "sidecar is missing") from None
        except OSError as err:
            raise CorruptCheckpoint(path, f"sidecar cannot be read: {err}") from None
        if not raw.lstrip().startswith(b"{") or b'"schema_version"' in raw:
            return parse_sidecar(raw, path, epoch)
        return self._candle_sidecar(raw, path, epoch)

    def _candle_sidecar(self, raw: bytes, path: str, epoch: int) -> Sidecar:
        """A sidecar CANDLE wrote (no ``schema_version``): adopted with its model file's size from the disk."""
        from candle_ckpt.core.candle_sidecar import from_candle

        try:
            probe = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            probe = None
        name = probe.get("model_file") if isinstance(probe, dict) else None
        if not (isinstance(name, str) and L.is_safe_filename(name)):
            return parse_sidecar(raw, path, epoch)  # reports what is wrong
        model = os.path.join(self.layout.epoch_dir(epoch), name)
        size = os.path.getsize(model) if os.path.isfile(model) and not os.path.islink(model) else None
        best = self.link_epoch("best") if os.path.lexists(self.layout.link("best")) else None
        return _checked_sidecar(path, epoch, lambda: from_candle(raw, source=path, model_size=size, best_epoch=best))

    def verify(
        self,
        epoch: int,
        *,
        reads: Iterable[str] = (),
        mapped: bool = False,
        progress: Callable[[int], None] | None = None,
        only: Iterable[str] | None = None,
    ) -> tuple[Sidecar, dict[str, bytes | mmap.mmap]]:
        """Check the sidecar and the size and CRC of every file of ``epoch``.

        Args:
            epoch: The checkpoint to check.
            reads: Names of files whose verified bytes are returned, so the
                caller can load them without reading the file a second time.
            mapped: Return the files read as read-only ``mmap`` objects
                instead of ``bytes``: the CRC then reads the page cache in
                place and the loader copies each byte once, straight into its
                arrays, as a plain file read would (a restart of a large
                checkpoint saves one full copy). Checkpoint files are never
                modified after their commit, so the mapping stays valid even
                if the checkpoint is pruned meanwhile.
            progress: Called with the number of bytes just checked, chunk by
                chunk (the CLI's progress bar); it must not raise.
            only: Check only these of the sidecar's files (None: all). A process
                of a multi-process job checks the parts it reads; a name the
                sidecar does not list is an error.

        Returns:
            ``(sidecar, {name: bytes or mmap})`` for the names in ``reads``.

        Raises:
            CorruptCheckpoint: naming the file and what is wrong with it.
        """
        side = self.read_sidecar(epoch)
        where = self.layout.epoch_dir(epoch)
        return side, self.verify_files(where, side, reads=reads, mapped=mapped, progress=progress, only=only)

    def verify_files(
        self,
        directory: str,
        side: Sidecar,
        *,
        reads: Iterable[str] = (),
        mapped: bool = False,
        progress: Callable[[int], None] | None = None,
        only: Iterable[str] | None = None,
    ) -> dict[str, bytes | mmap.mmap]:
        """Check the size and CRC of each file ``side`` lists in ``directory`` (or in ``only``; see :meth:`verify`).

        With :attr:`crc_scope` set, only the CRCs of the names it gives (and of ``reads``) are checked. With
        :attr:`keep_scope` set, the names it gives are read whole (as ``bytes``, whatever ``mapped``) and returned too.

        Returns:
            ``{name: bytes or mmap}`` for the names in ``reads`` (and :attr:`keep_scope`'s).
        """
        keep = set(self.keep_scope(directory, side)) & side.files.keys() if self.keep_scope is not None else set()
        wanted = set(reads) | keep
        chosen = None if only is None else set(only) | wanted
        if chosen is not None and not chosen <= side.files.keys():
            raise CorruptCheckpoint(directory, f"has no {', '.join(sorted(chosen - side.files.keys()))}")
        scope = self.crc_scope(directory, side) if self.crc_scope is not None else None
        crc = None if scope is None else set(scope) | wanted
        contents: dict[str, bytes | mmap.mmap] = {}
        for name, entry in side.files.items():
            if chosen is not None and name not in chosen:
                continue
            check = self.checksum and entry.crc32 is not None and (crc is None or name in crc)
            path = os.path.join(directory, name)
            given = self.prefetched.take(path) if self.prefetched is not None and name in keep else None
            data = verify_file(path, entry, name in wanted, mapped and name not in keep, check, progress, given)
            if data is not None:
                contents[name] = data
        return contents

    def candidates(self) -> Iterator[int]:
        """Epochs in restart preference order: ``last``, then by commit generation, newest first."""
        last = self.link_epoch("last")
        if last is not None:
            path = self.layout.epoch_dir(last)
            if os.path.isdir(path) and not os.path.islink(path):
                yield last  # the usual case: no listing, so a restart costs the same with 10 or 10,000 kept
        on_disk = self.epochs()
        ranked = []
        for epoch in on_disk:
            if epoch == last:
                continue
            try:
                ranked.append((self.read_sidecar(epoch).generation, epoch))
            except CheckpointError:
                ranked.append((-1, epoch))  # unreadable: tried last, and fails verify with its reason
        for _, epoch in sorted(ranked, reverse=True):
            yield epoch

    def find_valid(
        self,
        *,
        reads: Iterable[str] = (),
        on_problem: Callable[[int, str], None] | None = None,
        mapped: bool = False,
    ):
        """Return ``(epoch, sidecar, kept_bytes)`` of the newest valid checkpoint, or None.

        Every rejected candidate is reported through ``on_problem(epoch, reason)``.
        """
        reads = tuple(reads)
        last = self.link_epoch("last")
        if last is not None and not os.path.isdir(self.layout.epoch_dir(last)) and on_problem:
            on_problem(last, "'last' points to a checkpoint that does not exist")
        for epoch in self.candidates():
            try:
                side, contents = self.verify(epoch, reads=reads, mapped=mapped)
            except CheckpointError as err:
                if on_problem:
                    on_problem(epoch, str(err))
                continue
            return epoch, side, contents
        return None


def parse_sidecar(raw: bytes, path: str, epoch: int) -> Sidecar:
    """Validate the sidecar bytes read from ``path`` (local or remote) for ``epochs/NNN``.

    Raises:
        CorruptCheckpoint: if they are not a valid sidecar of that epoch.
    """
    return _checked_sidecar(path, epoch, lambda: Sidecar.from_json(raw, source=path))


def _checked_sidecar(path: str, epoch: int, parse: Callable[[], Sidecar]) -> Sidecar:
    """Run ``parse``: its SidecarError, or a sidecar of another epoch, becomes a CorruptCheckpoint of ``path``."""
    try:
        side = parse()
    except SidecarError as err:
        raise CorruptCheckpoint(path, str(err).removeprefix(path + ": ")) from None
    if side.epoch != epoch:
        raise CorruptCheckpoint(path, f"sidecar says epoch {side.epoch} but the directory is {L.epoch_name(epoch)}")
    return side


L_MAX_READ = 1 << 21  # never read more than this of a sidecar (it is refused above 1 MiB)
