"""CRC32 of buffers and files, computed with zlib-ng.

The CRC is the standard zlib CRC-32 (the one ``zlib.crc32`` returns), so a
user can check any file with stock tools. :class:`CrcFile` computes the
whole-file CRC *while* a file is being written, even when the writer (h5py)
seeks back and overwrites earlier bytes: it keeps the CRC of every written
extent, re-reads only the small extents that a later write partly overwrote,
and joins the pieces with ``crc32_combine``.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator

from zlib_ng import zlib_ng

from candle_ckpt.core import fileobj
from candle_ckpt.core.fileobj import SeekableFile

CHUNK = 8 << 20  # 8 MiB: large enough to run at memory speed, small enough to bound RAM.


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """Return the CRC-32 of ``data``, continuing from ``value``."""
    return zlib_ng.crc32(data, value) & 0xFFFFFFFF


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """Return the CRC of A+B given crc(A), crc(B) and len(B)."""
    return zlib_ng.crc32_combine(crc1, crc2, len2) & 0xFFFFFFFF


def format_crc(value: int) -> str:
    """Return the 8-digit lowercase hex form stored in sidecars."""
    return f"{value & 0xFFFFFFFF:08x}"


def iter_file_chunks(path: str | os.PathLike[str], chunk: int = CHUNK) -> Iterator[bytes]:
    """Yield the bytes of ``path`` in chunks."""
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return
            yield block


def crc32_file(path: str | os.PathLike[str], chunk: int = CHUNK) -> tuple[int, int]:
    """Return ``(crc32, size)`` of the file at ``path``, streaming."""
    value, size = 0, 0
    for block in iter_file_chunks(path, chunk):
        value = crc32(block, value)
        size += len(block)
    return value, size


def _nbytes(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


class CrcFile(SeekableFile):
    """A seekable binary file that knows its own CRC-32 when it is closed.

    It is the file object handed to h5py (``h5py.File(CrcFile(...), "w")``)
    and to any other writer. Writes go straight to the OS with ``pwrite``;
    large ones bypass the page cache where the file system allows it
    (:mod:`candle_ckpt.core.fileobj`).

    Args:
        path: The file to create (truncated if it exists).
        fsync: Callable used to make the file durable; it receives the fd.
        on_write: Optional ``hook(op, path)`` called before each write.
    """

    def __init__(self, path: str | os.PathLike[str], fsync=os.fsync, on_write=None) -> None:
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fsync = fsync
        self._on_write = on_write
        self._pos = 0
        self._size = 0
        # Sorted, non-overlapping extents: starts[i] -> (end, crc or None).
        self._starts: list[int] = []
        self._extents: dict[int, tuple[int, int | None]] = {}
        self.closed = False
        self.write_error: OSError | None = None
        self._direct: fileobj.DirectWriter | None = None
        self._direct_tried = False

    # -- the io.RawIOBase surface that h5py and zipfile use (seek, tell: SeekableFile) --
    def _extent(self) -> int:
        return self._size

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = _nbytes(data)
        n = len(view)
        if n == 0:
            return 0
        try:
            if self._on_write is not None:  # an injected fault is a failed write too
                self._on_write("write", self.path)
            if n >= fileobj.MIN_BYTES and self._direct_writer() is not None:
                self._direct.write(self._fd, view, self._pos)
            else:
                fileobj.pwrite_all(self._fd, view, self._pos)
        except OSError as err:
            # Kept because writers such as h5py replace it with their own vaguer
            # error ("driver write request failed"); the store re-raises this one.
            self.write_error = err
            raise
        self._record(self._pos, self._pos + n, crc32(view))
        self._pos += n
        self._size = max(self._size, self._pos)
        return n

    def _direct_writer(self) -> fileobj.DirectWriter | None:
        if not self._direct_tried:
            self._direct_tried = True
            self._direct = fileobj.open_direct(self.path)
        return self._direct

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(self._size - self._pos, 0)
        data = os.pread(self._fd, n, self._pos)
        self._pos += len(data)
        return data

    def readinto(self, buf) -> int:
        view = _nbytes(buf)
        data = os.pread(self._fd, len(view), self._pos)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        os.ftruncate(self._fd, size)
        self._size = size
        self._record(size, None, None)
        return size

    def fileno(self) -> int:
        return self._fd

    # -- extent bookkeeping ---------------------------------------------------
    def _record(self, start: int, end: int | None, value: int | None) -> None:
        """Register that [start, end) now holds bytes with CRC ``value``.

        ``end=None`` means "truncate at start": every extent past it goes.
        Extents that the new one partly overlaps keep their bytes but lose
        their CRC (they are re-read at close; in practice only small h5
        metadata blocks are ever overwritten).
        """
        stop = end if end is not None else float("inf")
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0:
            i = 0
        kept: list[tuple[int, int, int | None]] = []
        j = i
        while j < len(self._starts) and self._starts[j] < stop:
            s = self._starts[j]
            e, c = self._extents.pop(s)
            if e <= start:  # entirely before: untouched
                kept.append((s, e, c))
            else:
                if s < start:
                    kept.append((s, start, None))
                if e > stop:
                    kept.append((int(stop), e, None))
            j += 1
        del self._starts[i:j]
        if end is not None:
            kept.append((start, end, value))
        for s, e, c in kept:
            bisect.insort(self._starts, s)
            self._extents[s] = (e, c)

    def crc32(self, start: int = 0, end: int | None = None) -> int:
        """Return the CRC-32 of the file as it stands, re-reading only unknown extents.

        Args:
            start: First byte of the range to checksum (default: the whole file).
            end: End of the range, exclusive (default and upper bound: the size).
                A ``.keras`` archive needs the CRC of its weights member, which
                is a range of the file.
        """
        end = self._size if end is None else min(end, self._size)
        if start >= end:
            return 0  # the CRC-32 of no bytes
        total, pos = 0, start
        for s in self._starts:
            e, c = self._extents[s]
            if e <= start:
                continue
            if s >= end:
                break
            lo, hi = max(s, start), min(e, end)
            if lo > pos:  # a hole reads back as zeros
                total = crc32_combine(total, crc32(bytes(lo - pos)), lo - pos)
            if c is None or (lo, hi) != (s, e):
                c = crc32(os.pread(self._fd, hi - lo, lo))
            total = crc32_combine(total, c, hi - lo)
            pos = hi
        if pos < end:
            total = crc32_combine(total, crc32(bytes(end - pos)), end - pos)
        return total

    @property
    def size(self) -> int:
        return self._size

    def close(self) -> None:
        """Fsync and close. Idempotent."""
        if self.closed:
            return
        try:
            self._fsync(self._fd)
        finally:
            self.abort()

    def abort(self) -> None:
        """Close without fsync (the file is about to be discarded)."""
        if not self.closed:
            if self._direct is not None:
                self._direct.close()
            os.close(self._fd)
            self.closed = True

    def __enter__(self) -> CrcFile:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abort()
