"""The seek/tell surface of the hand-written file objects (standard library only).

h5py and ``zipfile`` take any object with ``seek``, ``tell``, ``read``,
``readinto`` and (to write) ``write`` and ``truncate``. Three such objects
exist, each for one reason: :class:`~candle_ckpt.core.checksum.CrcFile` (a
checkpoint file that knows its CRC), the ``.keras`` archive's weights window
(h5py writes into a member of the archive, in place:
:mod:`~candle_ckpt.storage.keras_archive`) and :class:`BufferFile`, the
read-only view of a buffer (h5py and ``zipfile`` read an mmap without copying
it). They share this base: a position, a size to seek from the end, and the
``io`` flags.
"""

from __future__ import annotations

import io


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
