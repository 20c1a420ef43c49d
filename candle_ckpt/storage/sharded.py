"""The sharded checkpoint format: one part file per process, and a manifest that ties them together.

A multi-process job writes one checkpoint together. Each process writes the
chunks of the arrays it owns (every value exactly once across the job) into
its own part, in the same ``work/`` directory; the primary then checks every
part and writes ``manifest.json``. All names are plain file names, so the
sidecar lists every file and ``candle-ckpt verify`` checks them like any other:

- ``part-RRRRR.bin``: the raw C-order bytes of rank RRRRR's chunks, each at a
  64-byte aligned offset;
- ``part-RRRRR.json``: its chunk index (path, dtype, global shape, index,
  offset, nbytes), the ``.bin``'s size and CRC32, and the size and CRC32 of the
  other files that rank wrote (its ``train.state.pRRRRR.npz``);
- ``manifest.json``: the format tag, the process count, every part's size and
  CRC32, and per variable its global shape, dtype, the sharding it was saved
  with and where each chunk lies.

This module is the format itself (names, dtypes, index arithmetic) and each
process's writer (:func:`write_part`). The primary's side, which checks every
part and writes the manifest, and the validation of everything read back, is
:mod:`candle_ckpt.storage.manifest`: nothing read from disk is trusted, each
failure a :class:`~candle_ckpt.core.errors.CorruptCheckpoint` naming the file
and what is wrong.

:mod:`candle_ckpt.storage.shardread` reads it back (any slice, memory-mapped).
docs/format.rst describes the format for other tools.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from candle_ckpt.core.checksum import format_crc
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.sidecar import FileEntry
from candle_ckpt.storage.commit import FileSpec, write_file

FORMAT = "candle_ckpt.sharded/1"
MANIFEST = "manifest.json"
ALIGN = 64  # bytes: every chunk starts at a multiple, so a mapped chunk is aligned for any dtype
MAX_INDEX_BYTES = 64 << 20  # a part index or manifest larger than this is refused

Index = tuple[tuple[int, int], ...]


def part_bin(rank: int) -> str:
    """The name of rank ``rank``'s data file: ``part-00003.bin``."""
    return f"part-{rank:05d}.bin"


def part_index(rank: int) -> str:
    """The name of rank ``rank``'s chunk index: ``part-00003.json``."""
    return f"part-{rank:05d}.json"


def dtype_of(name: str) -> np.dtype:
    """The numpy dtype called ``name`` (``bfloat16`` and the other ml_dtypes included)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: PLC0415 (only for the dtypes numpy does not know)

        found = getattr(ml_dtypes, name, None)
        if found is None:
            raise TypeError(f"dtype {name!r} is not a numpy or ml_dtypes type") from None
        return np.dtype(found)


def shape_of(index: Index) -> tuple[int, ...]:
    """The shape of the block ``index`` (``[start, stop)`` per dimension)."""
    return tuple(stop - start for start, stop in index)


def as_index(index: object, global_shape: Sequence[int]) -> Index:
    """Turn None, a tuple of slices (JAX's form) or of ``(start, stop)`` pairs into ``(start, stop)`` pairs.

    Raises:
        ValueError: the index has another rank, a step, or lies outside ``global_shape``.
    """
    shape = tuple(global_shape)
    if index is None:
        return tuple((0, n) for n in shape)
    items = tuple(index)
    if len(items) != len(shape):
        raise ValueError(f"index {index!r} has {len(items)} dimensions; the array has {len(shape)} ({shape})")
    out = []
    for item, n in zip(items, shape, strict=True):
        if isinstance(item, slice):
            if item.step not in (None, 1):
                raise ValueError(f"index {index!r}: a step other than 1 is not supported")
            start, stop = 0 if item.start is None else item.start, n if item.stop is None else item.stop
        else:
            start, stop = item
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= n:
            raise ValueError(f"index {index!r} is outside the global shape {shape}")
        out.append((start, stop))
    return tuple(out)


def overlap(a: Index, b: Index) -> Index | None:
    """The intersection of two blocks, or None if it is empty."""
    both = tuple((max(s1, s2), min(e1, e2)) for (s1, e1), (s2, e2) in zip(a, b, strict=True))
    if any(start >= stop for start, stop in both):
        return None
    return both


@dataclass(frozen=True, eq=False)
class Chunk:
    """One block of one global array, as a process owns it.

    Attributes:
        path: The variable's path (Keras ``variable.path``, e.g. ``dense/kernel``).
        dtype: Its dtype name (``float32``, ``bfloat16``...).
        global_shape: The shape of the whole array.
        index: ``(start, stop)`` per dimension of the block in the whole array.
        data: The block's values, on the host; its shape is ``stop - start`` per dimension.
    """

    path: str
    dtype: str
    global_shape: tuple[int, ...]
    index: Index
    data: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"a chunk's path must be a non-empty string; got {self.path!r}")
        object.__setattr__(self, "global_shape", tuple(int(n) for n in self.global_shape))
        object.__setattr__(self, "index", as_index(self.index, self.global_shape))
        want = dtype_of(self.dtype)
        if self.data.dtype != want or self.data.shape != shape_of(self.index):
            raise ValueError(
                f"chunk of {self.path!r}: data is {self.data.dtype}{list(self.data.shape)} but dtype and index say "
                f"{want}{list(shape_of(self.index))}"
            )


@dataclass(frozen=True)
class PartRecord:
    """What :func:`write_part` wrote: the sizes and CRC32s of the rank's files, by name."""

    rank: int
    files: dict[str, FileEntry] = field(default_factory=dict)


def write_part(
    directory: str, rank: int, chunks: Sequence[Chunk], fs: LocalFS | None = None, files: Iterable[FileSpec] = ()
) -> PartRecord:
    """Write rank ``rank``'s part into ``directory``: the ``.bin``, the other ``files``, the ``.json``; all fsynced.

    The ``.json`` is written last, so a part whose index exists is complete.
    The directory itself is fsynced by the primary before the commit rename.
    """
    fs = fs or LocalFS()
    entries: dict[str, FileEntry] = {}
    for spec in files:
        entries[spec.name] = write_file(fs, os.path.join(directory, spec.name), spec.write, True)
    table: list[dict] = []

    def write_bin(f) -> None:
        pos = 0
        for chunk in chunks:
            pad = -pos % ALIGN
            if pad:
                f.write(bytes(pad))
            data = np.ascontiguousarray(chunk.data)
            table.append(_chunk_row(chunk, pos + pad, data.nbytes))
            f.write(data.reshape(-1).view(np.uint8))  # bytes of any dtype (bfloat16 has no buffer format)
            pos += pad + data.nbytes

    name = part_bin(rank)
    entries[name] = bin_entry = write_file(fs, os.path.join(directory, name), write_bin, True)
    body = {
        "format": FORMAT,
        "rank": rank,
        "bin": {"file": name, "size": bin_entry.size, "crc32": bin_entry.crc32},
        "chunks": table,
        "files": {k: {"size": e.size, "crc32": e.crc32} for k, e in entries.items() if k != name},
    }
    raw = json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"
    value, size = fs.write_bytes(os.path.join(directory, part_index(rank)), raw)
    entries[part_index(rank)] = FileEntry(size, format_crc(value))
    return PartRecord(rank, entries)


def _chunk_row(chunk: Chunk, offset: int, nbytes: int) -> dict:
    return {
        "path": chunk.path,
        "dtype": dtype_of(chunk.dtype).name,
        "global_shape": list(chunk.global_shape),
        "index": [list(pair) for pair in chunk.index],
        "offset": offset,
        "nbytes": nbytes,
    }
