"""The sharded format's manifest: the primary checks every part and writes ``manifest.json``; every part index and
manifest read back is validated before any offset is used.

The format and each process's part writer are :mod:`candle_ckpt.storage.sharded`; docs/format.rst describes both.
Nothing read from disk is trusted: :func:`check_part` and :func:`check_manifest` raise
:class:`~candle_ckpt.core.errors.CorruptCheckpoint` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from candle_ckpt.core import layout as L
from candle_ckpt.core.checksum import crc32, format_crc
from candle_ckpt.core.errors import CorruptCheckpoint
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.sidecar import FileEntry
from candle_ckpt.storage.filecheck import verify_file
from candle_ckpt.storage.sharded import (
    FORMAT,
    MANIFEST,
    MAX_INDEX_BYTES,
    dtype_of,
    overlap,
    part_bin,
    part_index,
    shape_of,
)


@dataclass(frozen=True)
class Manifest:
    """What :func:`write_manifest` wrote: its body, and every file of the parts plus itself, by name."""

    body: dict
    files: dict[str, FileEntry]


def write_manifest(
    directory: str,
    process_count: int,
    sharding: dict[str, str] | None = None,
    extra: dict | None = None,
    fs: LocalFS | None = None,
    remote: dict[int, bytes] | None = None,
) -> Manifest:
    """Check every part (present, complete, its size), then write ``manifest.json`` (the primary, after every part).

    No part's data is read again: each rank computed its files' CRC32s while
    writing them (:func:`write_part`) and reports them in its ``.json``, which
    it writes last; here each file's size is checked against what its rank
    reported, and those CRC32s go into the manifest and the sidecar. A damaged
    byte is caught where it matters, when a restore reads the part (every
    reader checks the CRC32 of what it reads).

    Args:
        directory: The ``work/`` directory the ranks wrote their parts into.
        process_count: How many parts there must be (ranks ``0 .. process_count - 1``).
        sharding: A description of each variable's sharding, by path (kept in the manifest).
        extra: Anything else for the manifest (JSON-ready).
        fs: The file-system seam.
        remote: The part indexes (their exact bytes) of ranks whose parts are on their own node's disk, not in
            ``directory`` (a node-local job, :mod:`candle_ckpt.storage.multipart`): their files' sizes were
            checked by their writers; ``files`` lists them all the same.

    Raises:
        CorruptCheckpoint: a part is missing, incomplete or of the wrong size (naming its file),
            or the chunks do not cover each array exactly once.
    """
    fs = fs or LocalFS()
    remote = remote or {}
    files: dict[str, FileEntry] = {}
    parts, rows = [], []
    for rank in range(process_count):
        here = rank not in remote
        index = check_part(directory, rank, remote.get(rank))
        entry = FileEntry(index["bin"]["size"], index["bin"]["crc32"])
        if here:
            verify_file(os.path.join(directory, part_bin(rank)), entry, False, False, False, None)  # size, not CRC
        for name, e in index["files"].items():
            if here:
                verify_file(os.path.join(directory, name), FileEntry(e["size"], e["crc32"]), False, False, False, None)
            files[name] = FileEntry(e["size"], e["crc32"])
        files[part_bin(rank)] = entry
        files[part_index(rank)] = index["_entry"]
        parts.append({"file": part_bin(rank), "size": entry.size, "crc32": entry.crc32})
        rows.extend((rank, row) for row in index["chunks"])
    variables = merge_chunks(rows, sharding or {}, os.path.join(directory, MANIFEST))
    body = {"format": FORMAT, "process_count": process_count, "parts": parts, "variables": variables}
    body["extra"] = extra or {}
    raw = json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"
    value, size = fs.write_bytes(os.path.join(directory, MANIFEST), raw)
    files[MANIFEST] = FileEntry(size, format_crc(value))
    return Manifest(body, files)


# -- validation of the format's JSON (part indexes, manifest) --


def read_json(path: str, what: str, raw: bytes | None = None) -> tuple[Any, FileEntry]:
    """Read and parse a small JSON file (or ``raw``, its bytes sent by another process); return it and its size and
    CRC32."""
    if raw is None:
        if os.path.islink(path) or not os.path.isfile(path):
            raise CorruptCheckpoint(path, f"{what} is missing")
        with open(path, "rb") as f:
            raw = f.read(MAX_INDEX_BYTES + 1)
    if len(raw) > MAX_INDEX_BYTES:
        raise CorruptCheckpoint(path, f"{what} is larger than {MAX_INDEX_BYTES} bytes")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpoint(path, f"{what} is not valid JSON ({err})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CorruptCheckpoint(path, f"{what} is not in the {FORMAT} format")
    return body, FileEntry(len(raw), format_crc(crc32(raw)))


def check_part(directory: str, rank: int, raw: bytes | None = None) -> dict[str, Any]:
    """Read and validate rank ``rank``'s part index (or ``raw``, its bytes); its own size and CRC are under
    ``"_entry"``."""
    path = os.path.join(directory, part_index(rank))
    if raw is None and not os.path.lexists(path):
        raise CorruptCheckpoint(path, f"the part of rank {rank} is missing (that process did not finish its write)")
    body, entry = read_json(path, f"the part index of rank {rank}", raw)
    fail = _failer(path)
    if body.get("rank") != rank:
        fail(f"it says rank {body.get('rank')!r}, not {rank}")
    binary = body.get("bin")
    if not isinstance(binary, dict) or binary.get("file") != part_bin(rank):
        fail(f"'bin' must name {part_bin(rank)}")
    _entry(binary, "bin", fail)
    files = body.get("files")
    if not isinstance(files, dict):
        fail("'files' must be an object")
    for name, e in files.items():
        if not L.is_safe_filename(name) or name in (part_bin(rank), part_index(rank)):
            fail(f"file name {name!r} is not allowed")
        _entry(e, f"files[{name!r}]", fail)
    chunks = body.get("chunks")
    if not isinstance(chunks, list):
        fail("'chunks' must be a list")
    for row in chunks:
        check_row(row, binary["size"], fail)
    body["_entry"] = entry
    return body


def _failer(path: str):
    def fail(reason: str):
        raise CorruptCheckpoint(path, reason)

    return fail


def _int(value: Any, what: str, fail, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        fail(f"{what} must be an int >= {minimum}; got {value!r}")
    return value


def _entry(e: Any, what: str, fail) -> None:
    if not isinstance(e, dict):
        fail(f"{what} must be an object")
    _int(e.get("size"), f"{what}.size", fail)
    c = e.get("crc32")
    if not isinstance(c, str) or len(c) != 8:
        fail(f"{what}.crc32 must be 8 hex digits; got {c!r}")


def check_row(row: Any, part_size: int, fail, *, needs_path: bool = True) -> None:
    """Validate one chunk row: dtype, shapes, index inside the shape, bytes inside the part."""
    if not isinstance(row, dict):
        fail("a chunk must be an object")
    if needs_path and (not isinstance(row.get("path"), str) or not row["path"]):
        fail(f"a chunk's path must be a non-empty string; got {row.get('path')!r}")
    try:
        itemsize = dtype_of(str(row.get("dtype"))).itemsize
    except TypeError as err:
        fail(str(err))
    shape = row.get("global_shape")
    index = row.get("index")
    if not isinstance(shape, list) or not isinstance(index, list) or len(shape) != len(index):
        fail(f"chunk of {row.get('path')!r}: global_shape and index must be lists of the same length")
    for n, pair in zip(shape, index, strict=True):
        _int(n, "a global_shape entry", fail)
        if not (isinstance(pair, list) and len(pair) == 2):
            fail(f"chunk of {row.get('path')!r}: index {index!r} must hold [start, stop] pairs")
        start, stop = _int(pair[0], "an index start", fail), _int(pair[1], "an index stop", fail)
        if not start <= stop <= n:
            fail(f"chunk of {row.get('path')!r}: index {index!r} lies outside global_shape {shape!r}")
    offset, nbytes = _int(row.get("offset"), "offset", fail), _int(row.get("nbytes"), "nbytes", fail)
    count = 1
    for start, stop in index:
        count *= stop - start
    if nbytes != count * itemsize:
        fail(f"chunk of {row.get('path')!r}: nbytes {nbytes} is not {count} values of {itemsize} bytes")
    if offset + nbytes > part_size:
        fail(f"chunk of {row.get('path')!r}: bytes {offset}..{offset + nbytes} lie past the part's {part_size} bytes")


def merge_chunks(rows: Iterable[tuple[int, dict]], sharding: dict[str, str], source: str) -> dict[str, dict]:
    """Group the parts' chunk rows by variable; check that they agree and cover each array exactly once."""
    fail = _failer(source)
    variables: dict[str, dict] = {}
    for rank, row in rows:
        var = variables.setdefault(
            row["path"],
            {
                "global_shape": row["global_shape"],
                "dtype": row["dtype"],
                "sharding": str(sharding.get(row["path"], "")),
                "chunks": [],
            },
        )
        if var["global_shape"] != row["global_shape"] or var["dtype"] != row["dtype"]:
            fail(
                f"variable {row['path']!r}: part {rank} says {row['dtype']}{row['global_shape']}, "
                f"another says {var['dtype']}{var['global_shape']}"
            )
        var["chunks"].append({"part": rank, "index": row["index"], "offset": row["offset"], "nbytes": row["nbytes"]})
    for path, var in variables.items():
        check_cover(path, var, fail)
    return dict(sorted(variables.items()))


def check_cover(path: str, var: dict, fail) -> None:
    """The chunks of one variable do not overlap and together are the whole array."""
    blocks = [tuple(tuple(p) for p in c["index"]) for c in var["chunks"]]
    total = 1
    for n in var["global_shape"]:
        total *= n
    got = 0
    for block in blocks:
        n = 1
        for d in shape_of(block):
            n *= d
        got += n
    for i, a in enumerate(blocks):
        for b in blocks[i + 1 :]:
            if overlap(a, b) is not None:
                fail(f"variable {path!r}: chunks {list(a)} and {list(b)} overlap (a value was written twice)")
    if got != total:
        fail(f"variable {path!r}: the chunks hold {got} of its {total} values")


def check_manifest(body: dict, path: str) -> None:
    """Validate a manifest read back from disk (parts, and every variable's chunks)."""
    fail = _failer(path)
    count = _int(body.get("process_count"), "process_count", fail, 1)
    parts = body.get("parts")
    if not isinstance(parts, list) or len(parts) != count:
        fail(f"'parts' must list {count} parts")
    for rank, part in enumerate(parts):
        _entry(part, f"parts[{rank}]", fail)
        if part.get("file") != part_bin(rank):
            fail(f"parts[{rank}] must be {part_bin(rank)}")
    variables = body.get("variables")
    if not isinstance(variables, dict):
        fail("'variables' must be an object")
    for name, var in variables.items():
        if not isinstance(var, dict) or not isinstance(var.get("chunks"), list):
            fail(f"variable {name!r} must be an object with a 'chunks' list")
        for c in var["chunks"]:
            if not isinstance(c, dict):
                fail(f"variable {name!r}: a chunk must be an object")
            rank = _int(c.get("part"), "a chunk's part", fail)
            if rank >= count:
                fail(f"variable {name!r}: a chunk names part {rank}, but there are {count}")
            row = {**c, "path": name, "dtype": var.get("dtype"), "global_shape": var.get("global_shape")}
            check_row(row, parts[rank]["size"], fail)
        check_cover(name, var, fail)


__all__ = ["Manifest", "check_manifest", "check_part", "check_row", "merge_chunks", "read_json", "write_manifest"]
