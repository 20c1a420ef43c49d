"""The remote copy as fsspec sees it: opening ``ckpt_upload_url``, its ``epochs/NNN`` layout, its sidecars.

A remote checkpoint is ``<url>/epochs/NNN/<files>``, complete exactly when its
``ckpt-info.json`` exists (it is uploaded last). :mod:`candle_ckpt.storage.remote`
uploads and downloads through these.
"""

from __future__ import annotations

import json

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CorruptCheckpoint
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.reader import parse_sidecar


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
