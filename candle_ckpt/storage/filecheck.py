"""One checkpoint file checked against its sidecar entry: type, size and CRC32, read once.

The verified bytes can be kept (read, or mapped read-only so the CRC pass reads the page
cache in place and the loader copies each byte once) for a restart that loads them next.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable

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
) -> bytes | mmap.mmap | None:
    """Check one file's type, size and (if ``check``) CRC; return its bytes if ``read``, else None."""
    if os.path.islink(path) or not os.path.isfile(path):
        raise CorruptCheckpoint(path, "file is missing (or is not a regular file)")
    size = os.path.getsize(path)
    if size != entry.size:
        raise CorruptCheckpoint(path, f"size is {size} bytes but the sidecar recorded {entry.size}")
    data = None
    if read:
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
