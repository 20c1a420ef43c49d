"""The persistent tier (``ckpt_persistent_url``, formerly ``ckpt_upload_url``): its layout, reads and writes.

The fast tier is ``ckpt_directory`` (a node-local RAM disk or SSD). The
persistent tier is a shared file-system path or any fsspec URL, filled in the
background by the drain (:mod:`candle_ckpt.storage.drain`) and read by a
restart (:func:`persistent_candidates`, :func:`pull`). See docs/campaigns.rst.

Layout, two files per checkpoint whatever the number of files in it, so a
shared file system sees a small constant number of creates and metadata
operations per checkpoint::

    <url>/epochs/NNN/ckpt.tar          the checkpoint's files, one uncompressed tar
    <url>/epochs/NNN/ckpt-info.json    its sidecar, written LAST (its "archive" entry in
                                       extra: the tar's size and CRC32)
    <url>/steps/GGG/...                a step checkpoint (a preemption save), the same two files

A persistent checkpoint is complete exactly when its sidecar exists. One
written before the archive format (one remote file per checkpoint file, no
``archive`` entry) is still read.

Every operation on the persistent tier goes through :class:`PersistentTier`,
which counts files created, fsyncs, metadata operations and reads
(:attr:`PersistentTier.counts`). On a local or shared POSIX path the archive
and the sidecar are fsynced before the sidecar is considered written, and
the directory after it: a node that dies later cannot leave a sidecar
pointing at an archive that never reached the servers.

Storage options (credentials, endpoint) come from ``ckpt_upload_options`` (a
JSON object passed to fsspec) or from the backend's usual environment
variables (for s3fs: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``FSSPEC_S3_ENDPOINT_URL``...).
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.checksum import crc32, crc32_file, format_crc
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint
from candle_ckpt.core.layout import EPOCHS, STEPS
from candle_ckpt.core.sidecar import FileEntry, Sidecar
from candle_ckpt.storage.multipart import NODE_LOCAL
from candle_ckpt.storage.reader import parse_sidecar
from candle_ckpt.storage.sharded import MANIFEST

ARCHIVE = "ckpt.tar"


def remote_path(*parts: str) -> str:
    """Join URL path parts with single slashes (fsspec paths use ``/`` on every platform)."""
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))


def sort_key(side: Sidecar) -> tuple[int, int, int]:
    """How two checkpoints of either tier compare: generation, then epoch, then step (an epoch's end is last)."""
    return (side.generation, side.epoch, side.step if side.step is not None else 1 << 62)


def describe(side: Sidecar) -> str:
    """``epochs/006 (generation 6, epoch 6)`` or ``steps/012 (generation 12, epoch 5, step 3)``."""
    where = L.link_target(side.epoch) if side.step is None else L.step_name(side.generation)
    step = "" if side.step is None else f", step {side.step}"
    return f"{where} (generation {side.generation}, epoch {side.epoch}{step})"


class _CrcWriter:
    """A write-only file object that passes bytes on and keeps their CRC32 and count."""

    def __init__(self, f) -> None:
        self.f, self.crc, self.size = f, 0, 0

    def write(self, data: bytes) -> int:
        self.crc = crc32(data, self.crc)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


class PersistentTier:
    """One run's persistent directory, through fsspec, with every operation counted.

    Args:
        url: A path or an fsspec URL (``ckpt_persistent_url``).
        options: fsspec storage options as JSON text (``ckpt_upload_options``), or None.
        key: The parameter that named ``url``, for messages.

    Raises:
        ValueError: the URL's protocol is unknown to fsspec or its backend is
            not installed (the message names ``key``).
    """

    def __init__(self, url: str, options: str | None = None, key: str = "ckpt_persistent_url") -> None:
        import fsspec.core

        self.url, self.key = url, key
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **(json.loads(options) if options else {}))
        except (ValueError, ImportError) as err:
            raise ValueError(f"{key} {url!r} cannot be opened with fsspec: {err}") from None
        self.root = root.rstrip("/") or root
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.posix = "file" in protocols or "local" in protocols
        #: files_created, fsyncs, metadata_ops (ls, exists, mkdir, rm), reads (files read), bytes_written/read
        self.counts: Counter[str] = Counter()

    @classmethod
    def of(cls, cfg: CkptConfig) -> PersistentTier:
        return cls(cfg.persistent, cfg.upload_options, cfg.persistent_key)

    def dir(self, kind: str, number: int) -> str:
        return remote_path(self.root, kind, L.epoch_name(number))

    def url_of(self, kind: str, number: int) -> str:
        return remote_path(self.url, kind, L.epoch_name(number))

    # -- reads ---------------------------------------------------------------------
    def numbers(self, kind: str) -> list[int]:
        """Numbers of the ``<root>/<kind>/NNN`` directories (complete or not), ascending: one listing."""
        self.counts["metadata_ops"] += 1
        try:
            self.fs.invalidate_cache()
            names = self.fs.ls(remote_path(self.root, kind), detail=False)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            base = name.rstrip("/").rsplit("/", 1)[-1]
            number = L.parse_epoch(base)
            if number is not None and L.epoch_name(number) == base:
                found.append(number)
        return sorted(set(found))

    def read_sidecar(self, kind: str, number: int) -> Sidecar:
        """Read and validate one sidecar; CorruptCheckpoint if absent (an incomplete drain) or bad."""
        path = remote_path(self.dir(kind, number), L.SIDECAR)
        self.counts["reads"] += 1
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            raise CorruptCheckpoint(path, "sidecar is missing (drain incomplete)") from None
        self.counts["bytes_read"] += len(raw)
        if kind == EPOCHS:
            return parse_sidecar(raw, path, number)
        side = Sidecar.from_json(raw, source=path)
        if side.step is None or side.generation != number:
            raise CorruptCheckpoint(path, f"not the step checkpoint of generation {number}")
        return side

    def candidates(self, on_problem: Callable[[str, str], None] | None = None) -> list[tuple[str, Sidecar]]:
        """Every complete checkpoint as ``(kind, sidecar)``, newest first (:func:`sort_key`)."""
        found = []
        for kind in (EPOCHS, STEPS):
            for number in self.numbers(kind):
                try:
                    found.append((kind, self.read_sidecar(kind, number)))
                except CheckpointError as err:
                    if on_problem is not None:
                        on_problem(self.url_of(kind, number), str(err))
        return sorted(found, key=lambda item: sort_key(item[1]), reverse=True)

    def fetch(self, kind: str, side: Sidecar, into: str) -> None:
        """Download ``side``'s files into directory ``into`` and check each one's size and CRC32.

        Raises:
            CorruptCheckpoint: the archive or a file does not match the sidecar.
        """
        number = side.epoch if kind == EPOCHS else side.generation
        where = self.dir(kind, number)
        archive = side.extra.get("archive")
        if isinstance(archive, dict):
            local = os.path.join(into, ARCHIVE)
            self.counts["reads"] += 1
            self.fs.get_file(remote_path(where, ARCHIVE), local)
            value, size = crc32_file(local)
            self.counts["bytes_read"] += size
            if size != archive.get("size") or format_crc(value) != archive.get("crc32"):
                raise CorruptCheckpoint(
                    remote_path(where, ARCHIVE),
                    f"downloaded {size} bytes with CRC32 {format_crc(value)}, the sidecar recorded "
                    f"{archive.get('size')} bytes with CRC32 {archive.get('crc32')}",
                )
            with tarfile.open(local, "r:") as tar:
                for name in side.files:  # only the names the sidecar lists (plain names, checked when parsed)
                    member = tar.getmember(name)
                    if not member.isfile():
                        raise CorruptCheckpoint(name, "is not a regular file in the archive")
                    with tar.extractfile(member) as src, open(os.path.join(into, name), "wb") as dst:
                        shutil.copyfileobj(src, dst, 8 << 20)
            os.unlink(local)
        else:  # written before the archive format: one remote file per file
            for name in side.files:
                self.counts["reads"] += 1
                self.fs.get_file(remote_path(where, name), os.path.join(into, name))
        for name, entry in side.files.items():
            value, size = crc32_file(os.path.join(into, name))
            if archive is None:
                self.counts["bytes_read"] += size
            if size != entry.size:
                raise CorruptCheckpoint(name, f"downloaded {size} bytes but the sidecar recorded {entry.size}")
            if entry.crc32 is not None and format_crc(value) != entry.crc32:
                raise CorruptCheckpoint(name, f"downloaded CRC32 {format_crc(value)}, sidecar {entry.crc32}")

    # -- writes (the drain) ----------------------------------------------------------
    def put(self, kind: str, side: Sidecar, stage: str) -> int:
        """Write the checkpoint staged in directory ``stage`` (its files and sidecar): archive first, sidecar last.

        An older copy of the same checkpoint is hidden first (its sidecar removed).
        Returns the bytes written.
        """
        number = side.epoch if kind == EPOCHS else side.generation
        where = self.dir(kind, number)
        remote_side = remote_path(where, L.SIDECAR)
        self.counts["metadata_ops"] += 1
        self.fs.invalidate_cache()
        if self.fs.exists(remote_side):
            self.remove_sidecar(remote_side)
        self.counts["metadata_ops"] += 1
        self.fs.makedirs(where, exist_ok=True)  # needed by file://; a no-op for object stores

        archive = self._write(remote_path(where, ARCHIVE), _tar_of(stage, sorted(side.files), ARCHIVE))
        body = replace(side, extra={**side.extra, "archive": archive}).to_json()
        self._write(remote_path(where, L.SIDECAR), lambda f: f.write(body))
        if self.posix:
            self._fsync_dir(where)
        return archive["size"] + len(body)

    # -- a node-local job (docs/campaigns.rst): every rank's part apart, the sidecar once all are in ----------
    def put_part(self, kind: str, side: Sidecar, stage: str, rank: int) -> int:
        """Write rank ``rank``'s files of the checkpoint staged in ``stage`` (all but the manifest and the sidecar) as
        one archive, :func:`part_archive`: under a temporary name, then renamed, so a listed archive is whole.
        Returns the bytes written."""
        number = side.epoch if kind == EPOCHS else side.generation
        where = self.dir(kind, number)
        self.counts["metadata_ops"] += 1
        self.fs.makedirs(where, exist_ok=True)
        name = part_archive(rank, side.generation)
        tmp = remote_path(where, f".tmp-{uuid.uuid4().hex[:8]}-{name}")
        names = sorted(n for n in os.listdir(stage) if n not in (L.SIDECAR, MANIFEST))
        archive = self._write(tmp, _tar_of(stage, names, name))
        self.counts["metadata_ops"] += 1
        self.fs.mv(tmp, remote_path(where, name))
        if self.posix:
            self._fsync_dir(where)
        return archive["size"]

    def missing_parts(self, kind: str, side: Sidecar, processes: int) -> list[int]:
        """The ranks whose archive of ``side`` is not in the persistent tier yet: one listing."""
        number = side.epoch if kind == EPOCHS else side.generation
        self.counts["metadata_ops"] += 1
        try:
            self.fs.invalidate_cache()
            names = {n.rstrip("/").rsplit("/", 1)[-1] for n in self.fs.ls(self.dir(kind, number), detail=False)}
        except FileNotFoundError:
            names = set()
        return [r for r in range(processes) if part_archive(r, side.generation) not in names]

    def publish_parts(self, kind: str, side: Sidecar, stage: str) -> int:
        """The primary, once every rank's archive is in: ``manifest.json``, then the sidecar (every rank's files),
        LAST. Returns the bytes written."""
        number = side.epoch if kind == EPOCHS else side.generation
        where = self.dir(kind, number)
        remote_side = remote_path(where, L.SIDECAR)
        self.counts["metadata_ops"] += 1
        if self.fs.exists(remote_side):
            self.remove_sidecar(remote_side)
        self._write(remote_path(where, MANIFEST), copy_from(os.path.join(stage, MANIFEST)))
        body = persistent_sidecar(side).to_json()
        self._write(remote_side, lambda f: f.write(body))
        if self.posix:
            self._fsync_dir(where)
        return os.path.getsize(os.path.join(stage, MANIFEST)) + len(body)

    def fetch_part(self, kind: str, side: Sidecar, rank: int, into: str) -> list[str]:
        """Download the manifest and rank ``rank``'s archive of the node-local checkpoint ``side`` into ``into``,
        each file checked against the sidecar (size, CRC32). Returns the names fetched.

        Raises:
            CorruptCheckpoint: a file does not match the sidecar, or the archive is not there.
        """
        number = side.epoch if kind == EPOCHS else side.generation
        where = self.dir(kind, number)
        name = part_archive(rank, side.generation)
        local = os.path.join(into, name)
        self.counts["reads"] += 2
        self.fs.get_file(remote_path(where, MANIFEST), os.path.join(into, MANIFEST))
        try:
            self.fs.get_file(remote_path(where, name), local)
        except FileNotFoundError:
            raise CorruptCheckpoint(remote_path(where, name), "the archive of this process is missing") from None
        names = [MANIFEST]
        with tarfile.open(local, "r:") as tar:
            for member in tar.getmembers():
                if member.name not in side.files or not member.isfile():
                    raise CorruptCheckpoint(remote_path(where, name), f"{member.name!r} is not a file of the sidecar")
                with tar.extractfile(member) as src, open(os.path.join(into, member.name), "wb") as dst:
                    shutil.copyfileobj(src, dst, 8 << 20)
                names.append(member.name)
        os.unlink(local)
        for n in names:
            value, size = crc32_file(os.path.join(into, n))
            self.counts["bytes_read"] += size
            entry = side.files.get(n)
            if entry is None or size != entry.size or (entry.crc32 is not None and format_crc(value) != entry.crc32):
                raise CorruptCheckpoint(remote_path(where, n), "does not match the sidecar (size or CRC32)")
        return names

    def _write(self, path: str, fill: Callable[[Any], Any]) -> Any:
        """Create ``path``, fill it; on a POSIX path also fsync it before it counts as written."""
        self.counts["files_created"] += 1
        if self.posix:
            with open(path, "wb") as f:
                result = fill(f)
                f.flush()
                self.counts["fsyncs"] += 1
                os.fsync(f.fileno())
                self.counts["bytes_written"] += f.tell()
            return result
        with self.fs.open(path, "wb") as f:
            result = fill(f)
            self.counts["bytes_written"] += f.tell() if hasattr(f, "tell") else 0
        return result

    def _fsync_dir(self, path: str) -> None:
        self.counts["fsyncs"] += 1
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove_sidecar(self, path: str) -> None:
        self.counts["metadata_ops"] += 1
        self.fs.rm(path)

    def remove(self, kind: str, number: int) -> None:
        """Remove one checkpoint: its sidecar first (invisible), then the rest."""
        where = self.dir(kind, number)
        try:
            self.remove_sidecar(remote_path(where, L.SIDECAR))
        except FileNotFoundError:
            pass
        self.counts["metadata_ops"] += 1
        self.fs.rm(where, recursive=True)


def part_archive(rank: int, generation: int) -> str:
    """The persistent archive of one rank's part of a node-local checkpoint: ``part-00001.g000007.tar``."""
    return f"part-{rank:05d}.g{generation:06d}.tar"


def persistent_sidecar(side: Sidecar) -> Sidecar:
    """The persistent sidecar of the primary's copy ``side`` of a node-local checkpoint: every rank's files."""
    info = dict(side.extra[NODE_LOCAL])
    files = {k: FileEntry(e["size"], e["crc32"]) for k, e in info.pop("files").items()}
    info.pop("rank", None)
    return replace(side, files=files, extra={**side.extra, NODE_LOCAL: info})


def _tar_of(stage: str, names: list[str], archive_name: str) -> Callable[[Any], dict[str, Any]]:
    """A ``fill(f)`` writing ``names`` of ``stage`` as one uncompressed tar; it returns the tar's name, size and CRC."""

    def fill(f) -> dict[str, Any]:
        out = _CrcWriter(f)
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in names:
                info = tar.gettarinfo(os.path.join(stage, name), arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(os.path.join(stage, name), "rb") as src:
                    tar.addfile(info, src)
        return {"name": archive_name, "size": out.size, "crc32": format_crc(out.crc)}

    return fill


def copy_from(path: str) -> Callable[[Any], None]:
    """A file writer (for :meth:`PersistentTier._write` or ``FileSpec``) that copies the local file ``path``."""

    def write(f) -> None:
        with open(path, "rb") as src:
            shutil.copyfileobj(src, f, 8 << 20)

    return write
