"""A real mount that stops answering: a FUSE file system over a directory, each request held while a gate file exists.

Usage::

    python hang_fs.py BACK MOUNT GATE

Mounts a pass-through view of ``BACK`` at ``MOUNT`` (mfusepy over libfuse) and serves it in the foreground until
unmounted (``fusermount -u MOUNT``). While the file ``GATE`` exists, every request (a lookup, an open, a read, a
write, a listing) waits, as an NFS or FUSE mount does when its server stops answering: the caller sits in the
kernel, and for FUSE not even SIGKILL ends it while a request it sent is unanswered. Removing ``GATE`` lets every
held request through. Used by ``tests/integration/keras/test_hang.py``.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from typing import Any

from mfusepy import FUSE, FuseOSError, Operations

STAT = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
STATVFS = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize",
           "f_namemax")  # fmt: skip


class HeldFS(Operations):
    """``BACK`` passed through; every request first waits while ``gate`` exists."""

    use_ns = True  # utimens' times in nanoseconds (mfusepy)

    def __init__(self, back: str, gate: str) -> None:
        self.back, self.gate = back, gate

    def _path(self, path: str) -> str:
        while os.path.exists(self.gate):  # the server stopped answering
            time.sleep(0.05)
        return os.path.join(self.back, path.lstrip("/"))

    @staticmethod
    def _call(fn, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OSError as err:
            raise FuseOSError(err.errno) from None

    def access(self, path: str, mode: int) -> int:
        if not os.access(self._path(path), mode):
            raise FuseOSError(errno.EACCES)
        return 0

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = self._call(os.lstat, self._path(path))
        return {key: getattr(st, key + "_ns" if key.endswith("time") else key) for key in STAT}  # use_ns

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *self._call(os.listdir, self._path(path))]

    def readlink(self, path: str) -> str:
        return self._call(os.readlink, self._path(path))

    def mkdir(self, path: str, mode: int) -> int:
        return self._call(os.mkdir, self._path(path), mode) or 0

    def rmdir(self, path: str) -> int:
        return self._call(os.rmdir, self._path(path)) or 0

    def unlink(self, path: str) -> int:
        return self._call(os.unlink, self._path(path)) or 0

    def symlink(self, name: str, target: str) -> int:
        return self._call(os.symlink, target, self._path(name)) or 0

    def rename(self, old: str, new: str) -> int:
        return self._call(os.rename, self._path(old), self._path(new)) or 0

    def chmod(self, path: str, mode: int) -> int:
        return self._call(os.chmod, self._path(path), mode) or 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        where = self._path(path)
        return self._call(os.utime, where, **({} if times is None else {"ns": times})) or 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        return self._call(os.truncate, self._path(path), length) or 0

    def open(self, path: str, flags: int) -> int:
        return self._call(os.open, self._path(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return self._call(os.open, self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._path(path)
        return self._call(os.pread, fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._path(path)
        return self._call(os.pwrite, fh, data, offset)

    def flush(self, path: str, fh: int) -> int:
        self._path(path)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._path(path)
        return self._call(os.fsync, fh) or 0

    def release(self, path: str, fh: int) -> int:
        return self._call(os.close, fh) or 0

    def statfs(self, path: str) -> dict[str, Any]:
        st = self._call(os.statvfs, self._path(path))
        return {key: getattr(st, key) for key in STATVFS}


if __name__ == "__main__":
    back, mount, gate = sys.argv[1:4]
    FUSE(HeldFS(back, gate), mount, foreground=True, nothreads=False)
