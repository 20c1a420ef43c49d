"""A ``.keras`` archive written once, straight from a host snapshot, and read in place.

``model.save("x.keras")`` writes the weights into memory (or a temporary
file) and then copies them into the zip. Here the weights member is stored
uncompressed (``ZIP_STORED``) and h5py writes it at its final offset in the
archive, so a full-model checkpoint writes the state once.
``keras.models.load_model`` reads the result like any ``.keras`` file;
``restart()`` reads the weights member in place, as a slice of the
CRC-verified, memory-mapped file (:func:`weights_member_range`).

Layout::

    [local header of model.weights.h5]   fixed size: it carries a zip64 extra,
                                         so it fits whatever size the weights reach
    [model.weights.h5]                   written by h5py through a window
    [metadata.json] [config.json]        written by zipfile
    [central directory]                  written by zipfile

The first header is written last, once the weights' size and CRC-32 are
known; the CRC comes from the per-write CRCs :class:`CrcFile` keeps, so no
byte of the weights is read back.

A file format, written without Keras (as :mod:`candle_ckpt.storage.sharded` is the sharded one): the
Keras adapter hands it the weights' writer and the model's JSON (``keras/adapter.py``).
"""

from __future__ import annotations

import struct
import time
import zipfile
from collections.abc import Callable
from typing import Any

from candle_ckpt.core.checksum import CrcFile
from candle_ckpt.core.fileobj import BufferFile, SeekableFile

WEIGHTS_MEMBER = "model.weights.h5"  # the name keras.models.load_model looks for
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # the fixed part of a zip local file header
_LOCAL_MAGIC = b"PK\x03\x04"


class _Window(SeekableFile):
    """The file-like view of ``f`` from byte ``base`` on, that h5py writes the weights into."""

    def __init__(self, f: CrcFile, base: int) -> None:
        self.f = f
        self.base = base
        self._pos = 0
        self.size = 0

    def _extent(self) -> int:
        return self.size

    def write(self, data: Any) -> int:
        self.f.seek(self.base + self._pos)
        n = self.f.write(data)
        self._pos += n
        self.size = max(self.size, self._pos)
        return n

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(self.size - self._pos, 0)
        self.f.seek(self.base + self._pos)
        data = self.f.read(n)
        self._pos += len(data)
        return data

    def readinto(self, buf: Any) -> int:
        self.f.seek(self.base + self._pos)
        n = self.f.readinto(buf)
        self._pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        self.f.truncate(self.base + size)
        self.size = size
        return size


def write_keras_archive(f: CrcFile, write_weights: Callable[[Any], None], config_json: str, metadata_json: str) -> None:
    """Write a ``.keras`` archive into ``f``, the weights written once, in place.

    Args:
        f: The new, empty checkpoint file.
        write_weights: Writes a standard ``.weights.h5`` into the seekable
            file it is given (``keras/state.py``'s ``HostSnapshot.write_h5``).
        config_json: The model's ``config.json`` (``keras/state.py``'s ``ModelState.full_model_parts``).
        metadata_json: The archive's ``metadata.json``.
    """
    info = zipfile.ZipInfo(WEIGHTS_MEMBER, date_time=time.localtime()[:6])
    info.compress_type = zipfile.ZIP_STORED
    info.CRC = info.file_size = info.compress_size = info.header_offset = 0
    base = len(info.FileHeader(zip64=True))
    window = _Window(f, base)
    write_weights(window)
    info.file_size = info.compress_size = window.size
    info.CRC = f.crc32(base, base + window.size)
    f.seek(0)
    f.write(info.FileHeader(zip64=True))
    f.seek(base + window.size)
    # zipfile writes the small members and the central directory after the
    # weights (a zip may start anywhere in its file); the weights' entry is
    # registered with it so that the central directory lists it first.
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
        zf.filelist.append(info)
        zf.NameToInfo[WEIGHTS_MEMBER] = info
        zf.writestr("metadata.json", metadata_json)
        zf.writestr("config.json", config_json)


def weights_member_range(data: Any, name: str = "model.keras") -> tuple[int, int]:
    """Where the stored ``model.weights.h5`` lies in a ``.keras`` archive held in memory.

    Args:
        data: The archive's bytes (``bytes`` or a read-only ``mmap``).
        name: The archive's name, for error messages.

    Returns:
        ``(offset, size)`` of the member's bytes: a standard ``.weights.h5``.

    Raises:
        ValueError: ``data`` is not a zip, has no ``model.weights.h5``, or
            stores it compressed (a ``.keras`` that candle_ckpt did not write).
    """
    source = BufferFile(data)
    try:
        with zipfile.ZipFile(source) as zf:
            info = zf.getinfo(WEIGHTS_MEMBER)
    except (zipfile.BadZipFile, KeyError) as err:
        raise ValueError(f"{name}: not a .keras archive with a {WEIGHTS_MEMBER} member ({err})") from None
    finally:
        source.close()
    header = bytes(data[info.header_offset : info.header_offset + _LOCAL_HEADER.size])  # mmap slices are bytes
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{name}: {WEIGHTS_MEMBER} is compressed; candle_ckpt writes (and reads) it stored")
    if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_MAGIC:
        raise ValueError(f"{name}: the local header of {WEIGHTS_MEMBER} is damaged")
    fields = _LOCAL_HEADER.unpack(header)
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
    if start + info.file_size > len(data):
        raise ValueError(f"{name}: {WEIGHTS_MEMBER} runs past the end of the file")
    return start, info.file_size
