"""Reading a sharded checkpoint back: any slice of any variable, from the chunks that overlap it.

The part files are memory-mapped (read-only), so a process that needs a
quarter of an array reads a quarter of its bytes, and an array is never
gathered whole unless asked for. :func:`consolidate` gives every array whole
(the CLI's ``consolidate`` command).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from candle_ckpt.core.errors import CorruptCheckpoint
from candle_ckpt.core.sidecar import FileEntry
from candle_ckpt.storage.filecheck import verify_file
from candle_ckpt.storage.manifest import check_manifest, read_json
from candle_ckpt.storage.sharded import MANIFEST, Index, as_index, dtype_of, overlap, shape_of


@dataclass(frozen=True)
class VarInfo:
    """One variable of a sharded checkpoint: its global shape, dtype and the sharding it was saved with."""

    global_shape: tuple[int, ...]
    dtype: str
    sharding: str
    chunks: tuple[tuple[int, Index, int, int], ...]  # (part, index, offset, nbytes)


class ShardedReader:
    """One sharded checkpoint directory (``epochs/NNN``, ``steps/GGG`` or ``work/``), opened by its manifest.

    Args:
        directory: The checkpoint directory holding ``manifest.json`` and the parts.
        loaded: Files of it already in memory, by name (a restore's verified parts, read whole for their CRC):
            used instead of mapping those parts, and a chunk read whole from one is a view of it, not a copy.

    Raises:
        CorruptCheckpoint: the manifest is missing or invalid (naming it).
    """

    def __init__(self, directory: str | os.PathLike[str], loaded: Mapping[str, object] | None = None) -> None:
        self.directory = os.fspath(directory)
        path = os.path.join(self.directory, MANIFEST)
        body, _ = read_json(path, "the manifest")
        check_manifest(body, path)
        self.manifest = body
        self.process_count: int = body["process_count"]
        self.parts: list[dict] = body["parts"]
        self.extra: dict = body.get("extra") if isinstance(body.get("extra"), dict) else {}
        self.variables: dict[str, VarInfo] = {
            name: VarInfo(
                tuple(var["global_shape"]),
                var["dtype"],
                str(var.get("sharding", "")),
                tuple(
                    (c["part"], tuple(tuple(p) for p in c["index"]), c["offset"], c["nbytes"]) for c in var["chunks"]
                ),
            )
            for name, var in body["variables"].items()
        }
        # part -> its mapping, or its bytes (given in memory, or an empty part): views of bytes are safe to return
        self._maps: dict[int, mmap.mmap | bytes] = {}
        for rank, part in enumerate(self.parts):
            data = (loaded or {}).get(part["file"])
            if isinstance(data, bytes) and len(data) == part["size"]:
                self._maps[rank] = data
        self.bytes_from: dict[int, int] = {}  # part -> bytes :meth:`read` copied out of it (what it read there)
        self.bytes_in_place = 0  # of those, the bytes served as views of a part given in memory (no copy)

    def part_path(self, rank: int) -> str:
        return os.path.join(self.directory, self.parts[rank]["file"])

    def verify(self, parts: Iterable[int] | None = None) -> None:
        """Check the size and CRC32 of the given parts' data files (all if None).

        Raises:
            CorruptCheckpoint: naming the file and what is wrong.
        """
        for rank in sorted(set(range(self.process_count) if parts is None else parts)):
            if not 0 <= rank < self.process_count:
                raise ValueError(f"parts: {rank} is not a part of this checkpoint (0..{self.process_count - 1})")
            part = self.parts[rank]
            verify_file(self.part_path(rank), FileEntry(part["size"], part["crc32"]), False, False, True, None)

    def _info(self, path: str) -> VarInfo:
        try:
            return self.variables[path]
        except KeyError:
            raise KeyError(f"{path!r} is not a variable of {self.directory}") from None

    def parts_for(self, path: str, index: object = None) -> set[int]:
        """The parts a read of ``index`` (None: the whole array) of variable ``path`` needs."""
        info = self._info(path)
        want = as_index(index, info.global_shape)
        return {part for part, block, _, _ in info.chunks if overlap(block, want) is not None}

    def read(self, path: str, index: object = None) -> np.ndarray:
        """Return the values of ``index`` (a tuple of slices or ``(start, stop)`` pairs; None: all) of ``path``.

        The result does not keep the files mapped: a new array, or a read-only view of a part given in memory
        (``loaded``) when one chunk of it is exactly what is asked for.
        """
        info = self._info(path)
        want = as_index(index, info.global_shape)
        dtype = dtype_of(info.dtype)
        for part, block, offset, nbytes in info.chunks:
            data = self._maps.get(part)
            if block == want and isinstance(data, bytes):  # in place: the bytes object lives as long as the view
                self.bytes_from[part] = self.bytes_from.get(part, 0) + nbytes
                self.bytes_in_place += nbytes
                return np.frombuffer(data, dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape_of(want))
        out = np.empty(shape_of(want), dtype)
        for part, block, offset, nbytes in info.chunks:
            both = overlap(block, want)
            if both is None:
                continue
            src = np.frombuffer(self._map(part), dtype, count=nbytes // dtype.itemsize, offset=offset)
            self.bytes_from[part] = self.bytes_from.get(part, 0) + int(np.prod(shape_of(both))) * dtype.itemsize
            src = src.reshape(shape_of(block))
            out[tuple(slice(s - w, e - w) for (s, e), (w, _) in zip(both, want, strict=True))] = src[
                tuple(slice(s - b, e - b) for (s, e), (b, _) in zip(both, block, strict=True))
            ]
        return out

    def _map(self, rank: int) -> mmap.mmap | bytes:
        if rank not in self._maps:
            path, size = self.part_path(rank), self.parts[rank]["size"]
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) != size:
                raise CorruptCheckpoint(path, f"file is missing or is not {size} bytes long")
            if size == 0:
                self._maps[rank] = b""
            else:
                with open(path, "rb", buffering=0) as f:
                    self._maps[rank] = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        return self._maps[rank]

    def close(self) -> None:
        """Unmap the part files (arrays returned by :meth:`read` stay valid)."""
        for m in self._maps.values():
            if isinstance(m, mmap.mmap):
                m.close()
        self._maps.clear()

    def __enter__(self) -> ShardedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def consolidate(directory: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every variable of the sharded checkpoint in ``directory``, whole, after checking every part's CRC32."""
    with ShardedReader(directory) as reader:
        reader.verify()
        return {path: reader.read(path) for path in reader.variables}
