"""Large writes that bypass the page cache (``O_DIRECT``), where the file system allows it.

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
import mmap
import os

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
