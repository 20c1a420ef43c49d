"""The seek/tell surface of the hand-written file objects (standard library only).

h5py and ``zipfile`` take any object with ``seek``, ``tell``, ``read``,
``readinto`` and (to write) ``write`` and ``truncate``. Three such objects
exist, each for one reason: :class:`~candle_ckpt.core.checksum.CrcFile` (a
checkpoint file that knows its CRC), the ``.keras`` archive's weights window
(h5py writes into a member of the archive, in place) and the read-only view of
a buffer (h5py reads an mmap without copying it). They share this base: a
position, a size to seek from the end, and the ``io`` flags.
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
