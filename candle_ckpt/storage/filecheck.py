"""One checkpoint file checked against its sidecar entry: type, size and CRC32, read once.

The verified bytes can be kept (read, or mapped read-only so the CRC pass reads the page
cache in place and the loader copies each byte once) for a restart that loads them next.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterable

from candle_ckpt.core.checksum import crc32, format_crc, iter_file_chunks
from candle_ckpt.core.errors import CorruptCheckpoint
from candle_ckpt.core.sidecar import FileEntry


def verify_file(
    path: str,
    entry: FileEntry,
    read: bool,
    mapped: bool,
    check: bool,
    progress: Callable[[int], None] | None,
    given: bytes | None = None,
) -> bytes | mmap.mmap | None:
    """Check one file's type, size and (if ``check``) CRC; return its bytes if ``read``, else None.

    ``given``: the file's bytes, already read (:class:`Prefetch`), checked instead of reading it.
    """
    if os.path.islink(path) or not os.path.isfile(path):
        raise CorruptCheckpoint(path, "file is missing (or is not a regular file)")
    size = os.path.getsize(path)
    if size != entry.size:
        raise CorruptCheckpoint(path, f"size is {size} bytes but the sidecar recorded {entry.size}")
    data = None
    if read:
        if given is not None:
            data = given
        else:
            data = map_file(path, size) if mapped else read_file(path, size)
        if len(data) != entry.size:  # changed since the size check
            raise CorruptCheckpoint(path, f"size is {len(data)} bytes but the sidecar recorded {entry.size}")
        value = crc32(data) if check else None
        if progress is not None:
            progress(len(data))
    elif check:
        value = 0
        for block in iter_file_chunks(path):
            value = crc32(block, value)
            if progress is not None:
                progress(len(block))
    if check and format_crc(value) != entry.crc32:
        raise CorruptCheckpoint(path, f"CRC32 is {format_crc(value)} but the sidecar recorded {entry.crc32}")
    return data


class Prefetch:
    """Files read whole into memory on a background thread, ahead of their verification: a restore's likely
    parts, read while the processes meet and the primary chooses, instead of after.

    :meth:`take` gives a file's bytes only if the file is still the one read (same device, inode, size and
    modification time); the caller then checks their CRC as if it had read them itself. A file that cannot be
    read is passed over: the verification reads it again and reports what is wrong.
    """

    def __init__(self, paths: Iterable[str]) -> None:
        self._got: dict[str, tuple[tuple[int, ...], bytes]] = {}
        self._thread = threading.Thread(target=self._run, args=(list(paths),), name="candle-ckpt-prefetch",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self, paths: list[str]) -> None:
        for path in paths:
            try:
                with open(path, "rb", buffering=0) as f:
                    stat = os.fstat(f.fileno())
                    self._got[path] = (_identity(stat), f.read(stat.st_size + 1))
            except OSError:
                continue

    def take(self, path: str) -> bytes | None:
        """``path``'s bytes as read ahead (after that read ends), or None: not read, or changed since."""
        self._thread.join()  # no longer than reading the file here would take
        got = self._got.pop(path, None)
        if got is None:
            return None
        identity, data = got
        try:
            now = _identity(os.stat(path))
        except OSError:
            return None
        return data if now == identity and len(data) == identity[2] else None  # same file, not grown while read

    def close(self) -> None:
        """Wait for the reading to end and drop what was not taken."""
        self._thread.join()
        self._got.clear()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def read_file(path: str, size: int) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read(size + 1)  # one more: a file that grew since the size check is caught


def map_file(path: str, size: int) -> mmap.mmap | bytes:
    """Map ``path`` read-only, its pages populated up front (Linux) so the CRC pass does not fault."""
    if size == 0:
        return b""
    with open(path, "rb", buffering=0) as f:
        actual = os.fstat(f.fileno()).st_size
        if actual != size:
            return read_file(path, size)  # the caller reports the size mismatch
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        return mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
