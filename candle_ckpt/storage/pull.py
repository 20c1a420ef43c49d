"""Pulls from the persistent tier into the fast tier: the newest complete checkpoint, or one process's part.

A pulled checkpoint keeps its generation and lineage (its place in the run's history survives a move to a
new node), and is committed through the fast tier's own commit protocol, verified. The tier itself (layout,
reads, writes, counts) is :mod:`candle_ckpt.storage.remote`; docs/campaigns.rst says when a restart pulls.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import time
import uuid
from dataclasses import replace
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint
from candle_ckpt.core.group import is_primary_rank
from candle_ckpt.core.layout import EPOCHS, STEPS
from candle_ckpt.core.log import OpsLog, human_bytes
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.multipart import NODE_LOCAL
from candle_ckpt.storage.remote import PersistentTier, copy_from
from candle_ckpt.storage.store import CheckpointStore, FileSpec


def pull(tier: PersistentTier, kind: str, side: Sidecar, store: CheckpointStore, log: OpsLog) -> Sidecar:
    """Fetch one persistent checkpoint into the fast tier ``store``, verified, keeping its generation and lineage.

    The store must be open for writing. The local copy is committed through
    the store's commit protocol, so it is crash-safe like any other.

    Raises:
        CheckpointError, OSError: the download failed or did not verify; nothing was committed.
    """
    number = side.epoch if kind == EPOCHS else side.generation
    tmp = os.path.join(store.layout.ckpts, f".tmp-pull-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    start = time.perf_counter()
    try:
        tier.fetch(kind, side, tmp)
        elapsed = max(time.perf_counter() - start, 1e-9)
        extra = {k: v for k, v in side.extra.items() if k != "archive"}
        template = replace(side, extra={**extra, "pulled_from": tier.url_of(kind, number)})
        specs = [FileSpec(name, copy_from(os.path.join(tmp, name))) for name in side.files]
        store.continue_at(side.generation)  # its place in the lineage survives the pull
        if kind == EPOCHS:
            local = store.commit(side.epoch, specs, template)
        else:
            local = store.steps.commit(specs, template)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info(
        f"remote: pulled {kind}/{L.epoch_name(number)} from {tier.url}: {human_bytes(side.total_bytes)} downloaded "
        f"and verified in {elapsed:.3f} s ({side.total_bytes / elapsed / 1e6:.1f} MB/s)"
    )
    return local


def pull_first(
    tier: PersistentTier, ranked: list[tuple[str, Sidecar]], store: CheckpointStore, log: OpsLog
) -> Sidecar | None:
    """Pull the first of ``ranked`` (``(kind, sidecar)``, best first) that downloads and verifies into ``store``.

    Candidates that fail are logged and skipped for the next one. Returns the sidecar committed in the
    fast tier, or None if none was usable.
    """
    opened_here = not store.is_open  # the pull writes: it needs the lock, and gives it back unless already held
    store.open_for_write()
    try:
        for kind, side in ranked:
            try:
                return pull(tier, kind, side, store, log)
            except (CheckpointError, OSError, KeyError, tarfile.TarError) as err:
                number = side.epoch if kind == EPOCHS else side.generation
                log.warning(f"remote: cannot use {kind}/{L.epoch_name(number)} from {tier.url}: {err}")
    finally:
        if opened_here:
            store.close()
    return None


def pull_newest(cfg: CkptConfig, store: CheckpointStore, log: OpsLog, *, epoch: int | None = None) -> Sidecar | None:
    """Pull the newest complete persistent checkpoint (or exactly epoch ``epoch``) into ``store``.

    Returns:
        The sidecar committed in the fast tier, or None if no candidate was usable.
    """
    tier = PersistentTier.of(cfg)
    found = tier.candidates(lambda path, why: log.warning(f"remote: skipping {path}: {why}"))
    ranked = [(k, s) for k, s in found if epoch is None or (k == EPOCHS and s.epoch == epoch)]
    if not ranked:
        log.info(f"remote: no complete checkpoint at {tier.url}")
        return None
    return pull_first(tier, ranked, store, log)


def pull_part(
    cfg: CkptConfig, log: OpsLog, kind: str, epoch: int, generation: int, rank: int, processes: int
) -> Sidecar:
    """A process of a node-local job fetches its part of one persistent checkpoint into its own fast tier.

    ``kind`` is ``epoch`` or ``step``. Of a checkpoint drained by a node-local job it fetches the manifest and
    its own archive; of one drained whole (a shared ``ckpt_directory``), every file. The copy is committed
    through this process's store under the same generation, with ``extra["node_local"]`` as a save would
    write it (the primary's also listing every file).

    Raises:
        CheckpointError, OSError: the download failed or did not verify; nothing was committed.
    """
    tier = PersistentTier.of(cfg)
    where, number = (EPOCHS, epoch) if kind == "epoch" else (STEPS, generation)
    side = tier.read_sidecar(where, number)
    if side.generation != generation:
        raise CorruptCheckpoint(tier.url_of(where, number), f"generation {side.generation}, not {generation}")
    store = CheckpointStore.of(cfg)
    store.open_for_write()
    tmp = os.path.join(store.layout.ckpts, f".tmp-pull-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    start = time.perf_counter()
    try:
        if NODE_LOCAL in side.extra:
            names = tier.fetch_part(where, side, rank, tmp)
        else:
            tier.fetch(where, side, tmp)
            names = sorted(side.files)
        info: dict[str, Any] = {"rank": rank, "processes": processes}
        if is_primary_rank(rank):  # the primary's copy lists every file of the checkpoint
            info["files"] = {k: {"size": e.size, "crc32": e.crc32} for k, e in sorted(side.files.items())}
        extra = {k: v for k, v in side.extra.items() if k != "archive"}
        template = replace(side, extra={**extra, NODE_LOCAL: info, "pulled_from": tier.url_of(where, number)})
        specs = [FileSpec(name, copy_from(os.path.join(tmp, name))) for name in names]
        store.use_generation(generation)
        local = store.commit(epoch, specs, template) if kind == "epoch" else store.steps.commit(specs, template)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        store.close()
    nbytes = sum(e.size for e in local.files.values())
    log.info(
        f"remote: process {rank} pulled its part of {where}/{L.epoch_name(number)} from {tier.url}: "
        f"{human_bytes(nbytes)} downloaded and verified in {time.perf_counter() - start:.3f} s"
    )
    return local
