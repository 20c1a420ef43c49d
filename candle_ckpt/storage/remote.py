"""Remote copies of committed checkpoints (``ckpt_upload_url``), through fsspec.

Upload (:class:`RemoteMirror`, driven by the engine's ``after_commit`` hook):

* after a commit, the files of ``epochs/NNN`` are hard-linked into a staging
  directory ``ckpts/.tmp-upload-*`` on the writer's thread (instant, and safe
  against the local prune that may delete ``epochs/NNN`` before the upload
  runs; committed files are never modified in place). One background thread
  uploads the staged checkpoints in order, so training never waits for it;
* the remote layout is ``<url>/epochs/NNN/<files>``. The data files are put
  first and ``ckpt-info.json`` LAST: a remote checkpoint is complete exactly
  when its sidecar exists. Re-uploading an epoch first deletes the remote
  sidecar, so a half-replaced checkpoint is never visible either;
* the remote keeps what the local retention policy keeps (applied to the remote
  epochs, ``best``/``last``/the new upload protected); a deletion removes the
  sidecar first;
* ``ckpt_upload_mode=end`` uploads nothing during training and ``best`` and
  ``last`` at :meth:`RemoteMirror.finish`;
* failures are collected and handed to the engine, which applies
  ``ckpt_on_error`` (raise or warn) on the training thread. Each upload's
  bytes, duration and MB/s go to ``ckpt.log`` and :meth:`RemoteMirror.stats`.

Download (:func:`pull_newest`, used by ``restart()`` and the runner when the
local directory has no checkpoint): the newest complete remote checkpoint (by
commit generation) is downloaded, every file's size and CRC32 checked against
its sidecar, then committed locally through :meth:`CheckpointStore.commit`, so
the local copy is crash-safe like any other.

Storage options (credentials, endpoint) come from ``ckpt_upload_options`` (a
JSON object passed to fsspec) or from the backend's usual environment
variables (for s3fs: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``FSSPEC_S3_ENDPOINT_URL``...).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.checksum import crc32_file, format_crc
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint
from candle_ckpt.core.log import OpsLog, human_bytes
from candle_ckpt.core.retention import prune_plan
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.core.stats import transfer_record
from candle_ckpt.storage.reader import parse_sidecar
from candle_ckpt.storage.store import CheckpointStore, FileSpec


def open_remote(cfg: CkptConfig):
    """Return ``(filesystem, root path)`` for ``ckpt_upload_url``.

    Raises:
        ValueError: the URL's protocol is unknown to fsspec or its backend is
            not installed (the message names ``ckpt_upload_url``).
    """
    import fsspec.core

    options = json.loads(cfg.upload_options) if cfg.upload_options else {}
    try:
        fs, root = fsspec.core.url_to_fs(cfg.upload_url, **options)
    except (ValueError, ImportError) as err:
        raise ValueError(f"ckpt_upload_url {cfg.upload_url!r} cannot be opened with fsspec: {err}") from None
    return fs, root.rstrip("/")


def remote_path(*parts: str) -> str:
    """Join URL path parts with single slashes (fsspec paths use ``/`` on every platform)."""
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))


def remote_epochs(fs, root: str) -> list[int]:
    """Epoch numbers of ``<root>/epochs/NNN`` directories (complete or not), ascending."""
    try:
        fs.invalidate_cache()
        names = fs.ls(remote_path(root, "epochs"), detail=False)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        base = name.rstrip("/").rsplit("/", 1)[-1]
        epoch = L.parse_epoch(base)
        if epoch is not None and L.epoch_name(epoch) == base:
            found.append(epoch)
    return sorted(set(found))


def read_remote_sidecar(fs, root: str, epoch: int) -> Sidecar:
    """Read and validate a remote sidecar; CorruptCheckpoint if absent or bad."""
    path = remote_path(root, "epochs", L.epoch_name(epoch), L.SIDECAR)
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        raise CorruptCheckpoint(path, "sidecar is missing (upload incomplete)") from None
    return parse_sidecar(raw, path, epoch)


def _copy_from(path: str) -> Callable[[Any], None]:
    def write(f) -> None:
        with open(path, "rb") as src:
            shutil.copyfileobj(src, f, 8 << 20)

    return write


def pull_newest(cfg: CkptConfig, store: CheckpointStore, log: OpsLog, *, epoch: int | None = None) -> int | None:
    """Download the newest complete remote checkpoint (or ``epoch``) into ``store``.

    Called when the local directory has no checkpoint. Candidates whose
    download fails or whose size/CRC do not match their sidecar are skipped
    (logged) in favour of the next older one.

    Returns:
        The epoch pulled, or None if the remote store had no usable checkpoint.
    """
    fs, root = open_remote(cfg)
    ranked = []
    for e in remote_epochs(fs, root):
        if epoch is not None and e != epoch:
            continue
        try:
            ranked.append((read_remote_sidecar(fs, root, e).generation, e))
        except CheckpointError as err:
            log.warning(f"remote: skipping epoch {e} at {cfg.upload_url}: {err}")
    if not ranked:
        log.info(f"remote: no complete checkpoint at {cfg.upload_url}")
        return None
    # The pull writes: it needs the lock, and gives it back unless the caller already held it.
    opened_here = not store.is_open
    store.open_for_write()
    try:
        for _, e in sorted(ranked, reverse=True):
            tmp = os.path.join(store.layout.ckpts, f".tmp-pull-{uuid.uuid4().hex[:8]}")
            os.makedirs(tmp)
            start = time.perf_counter()
            try:
                side = read_remote_sidecar(fs, root, e)
                for name, entry in side.files.items():
                    local = os.path.join(tmp, name)
                    fs.get_file(remote_path(root, "epochs", L.epoch_name(e), name), local)
                    value, size = crc32_file(local)
                    if size != entry.size:
                        raise CorruptCheckpoint(name, f"downloaded {size} bytes but the sidecar recorded {entry.size}")
                    if entry.crc32 is not None and format_crc(value) != entry.crc32:
                        raise CorruptCheckpoint(name, f"downloaded CRC32 {format_crc(value)}, sidecar {entry.crc32}")
                elapsed = max(time.perf_counter() - start, 1e-9)
                template = replace(
                    side, extra={**side.extra, "pulled_from": remote_path(cfg.upload_url, "epochs", L.epoch_name(e))}
                )
                specs = [FileSpec(name, _copy_from(os.path.join(tmp, name))) for name in side.files]
                store.commit(e, specs, template)
            except (CheckpointError, OSError) as err:
                log.warning(f"remote: cannot use epoch {e} from {cfg.upload_url}: {err}")
                continue
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            log.info(
                f"remote: pulled epoch {e} from {cfg.upload_url}: {human_bytes(side.total_bytes)} downloaded and "
                f"verified in {elapsed:.3f} s ({side.total_bytes / elapsed / 1e6:.1f} MB/s)"
            )
            return e
    finally:
        if opened_here:
            store.close()
    return None


class RemoteMirror:
    """Mirrors committed checkpoints to ``ckpt_upload_url`` on one background thread.

    Args:
        cfg: The job's configuration (URL, options, mode, timeout).
        store: The local store (its layout, links and epochs).
        log: ``ckpt.log``.
        select: The retention policy's ``select(epochs, protected)``, applied to the remote epochs.
    """

    def __init__(
        self, cfg: CkptConfig, store: CheckpointStore, log: OpsLog, select: Callable[[list[int], set[int]], set[int]]
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.log = log
        self.select = select
        self.fs, self.root = open_remote(cfg)
        self.records: list[dict[str, Any]] = []
        self._queue: queue.Queue = queue.Queue()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._uploaded: dict[int, int] = {}  # epoch -> generation uploaded

    # -- called on the writer's thread -------------------------------------------
    def committed(self, side: Sidecar) -> None:
        """The engine's after-commit hook: stage and queue ``side.epoch`` (mode ``every``)."""
        if self.cfg.upload_mode == "every":
            self._enqueue(side.epoch)

    def _enqueue(self, epoch: int) -> None:
        try:
            stage = self._stage(epoch)
        except Exception as err:  # reported through ckpt_on_error, never breaks the commit
            self._record_error(RuntimeError(f"epoch {epoch}: cannot stage for upload: {err}"))
            return
        self._queue.put((epoch, stage))
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="candle_ckpt-upload", daemon=True)
                self._thread.start()

    def _stage(self, epoch: int) -> str:
        src = self.store.layout.epoch_dir(epoch)
        stage = os.path.join(self.store.layout.ckpts, f".tmp-upload-{L.epoch_name(epoch)}-{uuid.uuid4().hex[:8]}")
        os.makedirs(stage)
        for name in os.listdir(src):
            try:
                os.link(os.path.join(src, name), os.path.join(stage, name))
            except OSError:  # no hard links here: copy instead
                shutil.copy2(os.path.join(src, name), os.path.join(stage, name))
        return stage

    # -- the upload thread -----------------------------------------------------------
    def _run(self) -> None:
        while True:
            # One daemon thread for the life of the mirror: an idle wait costs nothing,
            # and a checkpoint cut off by interpreter exit is never visible (sidecar last).
            epoch, stage = self._queue.get()
            try:
                self._upload(epoch, stage)
            except BaseException as err:
                self._record_error(err if isinstance(err, Exception) else RuntimeError(repr(err)))
                self.log.warning(f"remote: upload of epoch {epoch} to {self.cfg.upload_url} failed: {err}")
            finally:
                shutil.rmtree(stage, ignore_errors=True)
                self._queue.task_done()

    def _upload(self, epoch: int, stage: str) -> None:
        with open(os.path.join(stage, L.SIDECAR), "rb") as f:
            side = Sidecar.from_json(f.read(), source=os.path.join(stage, L.SIDECAR))
        remote_dir = remote_path(self.root, "epochs", L.epoch_name(epoch))
        remote_side = remote_path(remote_dir, L.SIDECAR)
        start = time.perf_counter()
        self.fs.invalidate_cache()
        if self.fs.exists(remote_side):  # hide the older copy before replacing its files
            self.fs.rm(remote_side)
        self.fs.makedirs(remote_dir, exist_ok=True)  # needed by file://; a no-op for object stores
        for name in side.files:
            self.fs.put_file(os.path.join(stage, name), remote_path(remote_dir, name))
        self.fs.put_file(os.path.join(stage, L.SIDECAR), remote_side)
        elapsed = max(time.perf_counter() - start, 1e-9)
        nbytes = side.total_bytes + os.path.getsize(os.path.join(stage, L.SIDECAR))
        rec = transfer_record(nbytes, {"epoch": epoch, "url": remote_dir}, upload_s=elapsed)
        self.records.append(rec)
        self._uploaded[epoch] = side.generation
        self.log.info(
            f"remote: uploaded epoch {epoch} to {remote_dir}: {human_bytes(nbytes)} in {elapsed:.3f} s "
            f"({rec['mb_per_s']:.1f} MB/s)"
        )
        self._prune(epoch)

    def _prune(self, uploaded: int) -> None:
        epochs = remote_epochs(self.fs, self.root)
        links = (self.store.link_epoch("best"), self.store.link_epoch("last"))
        _, doomed = prune_plan(epochs, self.select, [e for e in (*links, uploaded) if e is not None])
        for e in doomed:
            remote_dir = remote_path(self.root, "epochs", L.epoch_name(e))
            if self.fs.exists(remote_path(remote_dir, L.SIDECAR)):  # invisible first, then gone
                self.fs.rm(remote_path(remote_dir, L.SIDECAR))
            self.fs.rm(remote_dir, recursive=True)
            self._uploaded.pop(e, None)
            self.log.info(f"remote: pruned epoch {e} from {self.cfg.upload_url}")

    def _record_error(self, err: BaseException) -> None:
        with self._lock:
            self._errors.append(err)

    # -- called on the training thread -----------------------------------------------
    def take_errors(self) -> list[BaseException]:
        """Return and forget the upload errors collected so far."""
        with self._lock:
            errors, self._errors = self._errors, []
        return errors

    def finish(self, timeout: float) -> bool:
        """Queue ``best``/``last`` (mode ``end``) and wait for the uploads; True if all finished."""
        if self.cfg.upload_mode == "end":
            for name in ("best", "last"):
                epoch = self.store.link_epoch(name)
                if epoch is None:
                    continue
                try:
                    generation = self.store.read_sidecar(epoch).generation
                except CheckpointError as err:
                    self._record_error(err)
                    continue
                if self._uploaded.get(epoch) != generation and all(e != epoch for e, _ in list(self._queue.queue)):
                    self._enqueue(epoch)
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._queue.unfinished_tasks:
            self.log.warning(f"remote: uploads still running after {timeout} s; they continue in the background")
            return False
        return True

    def stats(self) -> list[dict[str, Any]]:
        return list(self.records)
