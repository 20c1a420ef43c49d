"""The hand-written file objects: their seek/tell surface, and large writes past the page cache (standard
library only).

h5py and ``zipfile`` take any object with ``seek``, ``tell``, ``read``,
``readinto`` and (to write) ``write`` and ``truncate``. Three such objects
exist, each for one reason: :class:`~candle_ckpt.core.checksum.CrcFile` (a
checkpoint file that knows its CRC), the ``.keras`` archive's weights window
(h5py writes into a member of the archive, in place:
:mod:`~candle_ckpt.storage.keras_archive`) and :class:`BufferFile`, the
read-only view of a buffer (h5py and ``zipfile`` read an mmap without copying
it). They share this base: a position, a size to seek from the end, and the
``io`` flags.

**Large writes bypass the page cache** (``O_DIRECT``), where the file system allows it.

A checkpoint is written once and read rarely. Written through the page cache,
each save first fills fresh cache pages with a copy of the state (on the
virtual machines of shared clusters, the slowest part of a save) and then
pushes out the training data that the next epoch reads. Here the aligned middle
of each large write goes to the disk straight from one reused, page-aligned
buffer; the unaligned edges (and every small write, such as h5py's metadata)
go through the page cache as before. The kernel keeps the two coherent: a
direct write first writes back and drops any cached pages of its range.

Where ``O_DIRECT`` is refused (tmpfs, some network file systems, an alignment
stricter than ours) the file is written through the page cache, as if this
module did not exist. ``CANDLE_CKPT_DIRECT_IO=0`` turns it off.
"""

from __future__ import annotations

import errno
import io
import mmap
import os


class SeekableFile:
    """A position in a file of :meth:`_extent` bytes; subclasses read and write at it.

    Seeking before the start stops at 0, as ``io.BytesIO`` does for a relative seek.
    """

    _pos: int = 0
    writable_file = True  #: False for a read-only view

    def _extent(self) -> int:
        """The size ``SEEK_END`` counts from."""
        raise NotImplementedError

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return self.writable_file

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR, io.SEEK_END):
            raise ValueError(f"whence must be 0, 1 or 2; got {whence}")
        base = (0, self._pos, self._extent())[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def flush(self) -> None:
        """Nothing is buffered here."""


class BufferFile(SeekableFile, io.BytesIO):
    """A read-only, seekable file over any buffer (bytes, mmap), without copying it.

    ``io.BytesIO(data)`` copies anything but ``bytes`` whole; here h5py's
    ``readinto`` copies each byte once, straight into its destination. It
    subclasses ``BytesIO`` (left empty) because Keras's ``H5IOStore`` accepts
    only that type; its seek/tell surface is :class:`SeekableFile`'s.
    """

    writable_file = False

    def __init__(self, data) -> None:
        io.BytesIO.__init__(self)
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def _extent(self) -> int:
        return len(self._view)

    def readinto(self, buf) -> int:
        dst = memoryview(buf).cast("B")
        n = max(0, min(len(dst), len(self._view) - self._pos))
        dst[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        data = self._view[self._pos : end].tobytes() if end > self._pos else b""
        self._pos += len(data)
        return data

    def write(self, data) -> int:
        raise io.UnsupportedOperation("read-only")

    def close(self) -> None:
        if not self.closed:
            self._view.release()  # so that an mmap behind it can be closed
        super().close()


# -- large writes past the page cache ---------------------------------------------------------------------------
ALIGN = 4096  # covers 512-byte and 4 KiB logical blocks
MIN_BYTES = 4 << 20  # smaller writes are not worth the extra descriptor
BOUNCE = 8 << 20


def enabled() -> bool:
    """Whether large writes may bypass the page cache (``CANDLE_CKPT_DIRECT_IO``, default on)."""
    return hasattr(os, "O_DIRECT") and os.environ.get("CANDLE_CKPT_DIRECT_IO", "1") != "0"


class DirectWriter:
    """Writes the aligned middle of large writes to ``path`` with ``O_DIRECT``.

    Raises:
        OSError: from ``open`` if the file system refuses ``O_DIRECT``.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        self._buf = mmap.mmap(-1, BOUNCE)  # page-aligned, reused for every chunk
        self.refused = False

    def write(self, fd: int, view: memoryview, pos: int) -> None:
        """Write all of ``view`` at ``pos``: the edges through ``fd``, the middle directly."""
        n = len(view)
        head = -pos % ALIGN
        end = max(head, (pos + n) // ALIGN * ALIGN - pos)
        pwrite_all(fd, view[:head], pos)
        off = head
        while off < end and not self.refused:
            m = min(BOUNCE, end - off)
            self._buf[:m] = view[off : off + m]
            try:
                done = os.pwrite(self._fd, memoryview(self._buf)[:m], pos + off)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                self.refused, done = True, 0  # an alignment stricter than ours: the page cache from here on
            off += done
            if done < m:  # short: the rest of this write through the page cache
                break
        pwrite_all(fd, view[off:], pos + off)

    def close(self) -> None:
        os.close(self._fd)
        try:
            self._buf.close()
        except BufferError:  # a traceback still holds a view of it: freed with that
            pass


def pwrite_all(fd: int, view: memoryview, pos: int) -> None:
    """``pwrite`` all of ``view`` at ``pos``."""
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], pos + written)


def open_direct(path: str) -> DirectWriter | None:
    """A :class:`DirectWriter` for ``path``, or None where direct writes are off or refused."""
    if not enabled():
        return None
    try:
        return DirectWriter(path)
    except OSError:
        return None
