"""How bytes become durable: fsync, atomic rename, atomic link replace.

Every change the commit protocol makes on disk (create, write, fsync, rename,
link, delete) goes through one :class:`LocalFS` object; reads do not. Each
operation first calls :meth:`LocalFS.hook` with its name and path, which is
where tests inject faults at every step of the commit protocol and where the
power-loss harness records the sequence.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid

from candle_ckpt.core.checksum import CrcFile

POINTER_MAX = 256  # bytes: a pointer file holds "epochs/NNN\n"


class LocalFS:
    """The POSIX file system, with every durable step made explicit."""

    def hook(self, op: str, path: str) -> None:
        """Called before each operation; override to record or to fail."""

    # -- files ---------------------------------------------------------------
    def create(self, path: str) -> CrcFile:
        """Create ``path`` for writing; its CRC is tracked as it is written."""
        self.hook("create", path)
        return CrcFile(path, fsync=lambda fd: self.fsync(fd, path), on_write=self.hook)

    def fsync(self, fd: int, path: str) -> None:
        self.hook("fsync", path)
        os.fsync(fd)

    def write_bytes(self, path: str, data: bytes) -> tuple[int, int]:
        """Write ``data`` to a new file ``path``, fsync it, return (crc, size)."""
        with self.create(path) as f:
            f.write(data)
            value = f.crc32()
        return value, len(data)

    # -- directories ---------------------------------------------------------
    def makedirs(self, path: str, durable: bool = False) -> None:
        """Create ``path`` and missing parents.

        Args:
            durable: Also fsync the parent of every directory created, so the
                new directories survive a power cut (needed for ``ckpts/`` and
                ``epochs/``; ``work/`` becomes durable through its rename).
        """
        missing = []
        p = os.path.abspath(path)
        while not os.path.isdir(p):
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            self.mkdir(d)
        if durable:
            for d in missing:
                self.fsync_dir(os.path.dirname(d))

    def mkdir(self, path: str) -> None:
        """Create one directory whose parent exists (one that appeared meanwhile is fine)."""
        self.hook("mkdir", path)
        try:
            os.mkdir(path)
        except FileExistsError as err:
            if not os.path.isdir(path):  # os.mkdir says only "File exists"
                raise FileExistsError(err.errno, f"{path!r} is a file, not a directory") from None

    def fsync_dir(self, path: str) -> None:
        """Make the entries of directory ``path`` (creates, renames) durable."""
        self.hook("fsync_dir", path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        """Atomically rename; fails if ``dst`` is a non-empty directory."""
        self.hook("rename", dst)
        os.rename(src, dst)

    def replace(self, src: str, dst: str) -> None:
        self.hook("replace", dst)
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        self.hook("unlink", path)
        os.unlink(path)

    def rmtree(self, path: str) -> None:
        self.hook("rmtree", path)
        shutil.rmtree(path)  # errors are raised: each caller decides whether a leftover matters

    def symlink(self, target: str, path: str) -> None:
        self.hook("symlink", path)
        os.symlink(target, path)

    # -- links ---------------------------------------------------------------
    def set_link(self, path: str, target: str) -> str:
        """Atomically point ``path`` at relative ``target``.

        A temporary symlink is made beside ``path`` and ``os.replace``-d over
        it, so a reader sees the old link or the new one, never neither. Where
        the file system has no symlinks, the same is done with a small pointer
        file holding ``target``. The parent directory is fsynced.

        Returns:
            "symlink" or "pointer", the form that was written.
        """
        parent = os.path.dirname(path)
        tmp = os.path.join(parent, f".tmp-{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
        try:
            self.symlink(target, tmp)
            form = "symlink"
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
                raise
            self.write_bytes(tmp, (target + "\n").encode())
            form = "pointer"
        try:
            self.replace(tmp, path)
        except BaseException:
            _quiet_unlink(tmp)
            raise
        self.fsync_dir(parent)
        return form


def read_link(path: str) -> str | None:
    """Return the target of a symlink or pointer file, or None if absent.

    Raises:
        ValueError: if ``path`` exists but is neither a link nor a small file.
    """
    if os.path.islink(path):
        return os.readlink(path)
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):
        raise ValueError(f"{path} is neither a symlink nor a pointer file")
    if os.path.getsize(path) > POINTER_MAX:
        raise ValueError(f"pointer file {path} is larger than {POINTER_MAX} bytes")
    with open(path, "rb") as f:
        return f.read(POINTER_MAX).decode("utf-8", "replace").strip()


def _quiet_unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["LocalFS", "read_link"]
