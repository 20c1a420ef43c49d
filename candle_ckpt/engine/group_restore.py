"""``restart()`` of a multi-process job, as the engine sees it: the primary chooses, every process verifies, all
agree or nothing (no framework here).

The one choose-verify-load protocol of every multi-process job, over a :class:`~candle_ckpt.core.group.Group`:
JAX processes (``multihost/group_restart.py``, ``runner/job.py``) and ``tf.distribute`` workers
(``distributed/worker_state.py``) alike. Call :func:`agree_on_checkpoint` on every process; the order:

1. one meeting tells a shared ``ckpt_directory`` from node-local ones (:mod:`~candle_ckpt.engine.node_restore`,
   which then decides the tier and the checkpoint itself);
2. the primary (rank 0) chooses the checkpoint exactly as a one-process ``restart()`` does (``last``, the CRC
   fallback to older ones, a newer step checkpoint, the persistent tier's newer one), except that of a sharded
   checkpoint it checks the CRC of the files it will read itself (the manifest, its training state, the parts
   holding its slices) and only the size of the others; it broadcasts its choice over the group;
3. every other process verifies the files of that exact checkpoint it will read (size and CRC), and the
   processes ``exchange`` the outcome: if one failed, the primary rejects that checkpoint (logging why, in
   every process's words) and chooses again, every process with it, until all agree or nothing is left. No
   byte is CRC-checked twice, and no process reads a part it does not need. A part a process loads from
   whole (``keep``) is read once, into memory, for its CRC and its values; the processes other than the
   primary start that read on a thread as the restore begins (of the checkpoint ``last`` names, the usual
   choice), so that it overlaps the primary's choosing.

The caller then loads what was agreed (``engine.resume.load_chosen``) through its adapter.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CorruptCheckpoint, NoValidCheckpoint
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine import node_restore
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.resume import Chosen, select_checkpoint
from candle_ckpt.storage.filecheck import Prefetch
from candle_ckpt.storage.sharded import MANIFEST
from candle_ckpt.storage.store import CheckpointStore

# needed(where): the files of the sharded checkpoint ``where`` this process reads (None: a job that writes none).
Needed = Callable[[str], set[str]] | None
# keep(names): of a sharded checkpoint's files, those this process loads from whole, read once for their CRC and
# their values (returned with the reads).
Keep = Callable[[Iterable[str]], set[str]] | None
# The primary's part of a choice round: select() chooses, reject(said, reasons) rules out what a process failed.
Primary = tuple[Callable[[], Chosen | None], Callable[[str, list[str]], None]]


def _choice(chosen: Chosen | None) -> str:
    if chosen is None:
        return "none"
    kind = "step" if chosen.sidecar.step is not None else "epoch"
    return f"{kind}:{chosen.epoch}:{chosen.sidecar.generation}"


def _where(layout: L.Layout, said: str) -> str:
    """The directory of the checkpoint a choice names (``epoch:E:G`` or ``step:E:G``)."""
    kind, epoch, generation = said.split(":")
    return layout.step_dir(int(generation)) if kind == "step" else layout.epoch_dir(int(epoch))


def _keep_scope(needed: Needed, keep: Keep) -> Callable[[str, Any], set[str]] | None:
    """The store's ``keep_scope``: of a sharded checkpoint, ``keep(its files)`` (each also in ``needed``)."""
    if keep is None or needed is None:
        return None
    return lambda directory, side: keep(side.files) if side.model_file == MANIFEST else set()


def _verify_choice(
    cfg: CkptConfig,
    said: str,
    reads: tuple[str, ...],
    needed: Needed,
    keep: Keep,
    ahead: Prefetch | None,
    mapped: bool,
) -> Chosen:
    """The checkpoint the primary chose, verified on this process: of a sharded one, only ``needed(where)``."""
    kind, epoch, generation = said.split(":")
    store = CheckpointStore.of(cfg)
    store.prefetched = ahead
    if kind == "step":
        where, side = store.layout.step_dir(int(generation)), store.steps.read_sidecar(int(generation))
    else:
        where, side = store.layout.epoch_dir(int(epoch)), store.read_sidecar(int(epoch))
        if side.generation != int(generation):
            raise NoValidCheckpoint(
                f"{where}: generation {side.generation} on disk, but the primary chose generation {generation} "
                "(is ckpt_directory on a file system shared by every process?)"
            )
    if side.model_file == MANIFEST and needed is not None:  # the manifest, this process's state, its slices' parts
        wanted = needed(where)
        kept = keep(side.files) & wanted if keep is not None else set()  # of all its files, not only the wanted
        store.keep_scope = lambda directory, side: kept
        contents = store.verify_files(where, replace(side, files={k: e for k, e in side.files.items() if k in wanted}),
                                      reads=reads, mapped=mapped)  # fmt: skip
    else:
        contents = store.verify_files(where, side, reads=reads, mapped=mapped)
    return Chosen(int(epoch), side, contents)


def _prefetch(cfg: CkptConfig, keep: Keep) -> Prefetch | None:
    """Start reading, on a thread, the parts this process will most likely load: its ``keep`` of the checkpoint
    ``last`` names (the usual choice), so that its read overlaps the primary's choosing instead of following it.
    Only what the verification then finds unchanged is used, and its CRC checked as always."""
    if keep is None:
        return None
    where = os.path.realpath(L.Layout.of(cfg).link("last"))
    try:
        names = os.listdir(where)
    except OSError:
        return None
    return Prefetch(os.path.join(where, name) for name in keep(names)) if MANIFEST in names else None


def _primary_store(
    cfg: CkptConfig, needed: Needed, keep: Keep, store: CheckpointStore | None, fs: LocalFS | None
) -> tuple[CheckpointStore, Callable[[str, list[str]], None]]:
    """The primary's store for choosing (``store``, the writer's own, or a new one): of a sharded checkpoint it
    checks the CRC of the files it reads (and the size of every file), the others check theirs; a checkpoint
    another process rejected is skipped, with why. And ``reject(said, reasons)``, which rules one out."""
    store = store if store is not None else CheckpointStore.of(cfg, fs=fs)
    rejected: dict[str, str] = {}

    def scope(directory: str, side: Any) -> set[str] | None:
        if directory in rejected:
            raise CorruptCheckpoint(directory, rejected[directory])
        return needed(directory) if side.model_file == MANIFEST and needed is not None else None

    def reject(said: str, reasons: list[str]) -> None:
        rejected[_where(store.layout, said)] = "; ".join(reasons)

    store.crc_scope, store.keep_scope = scope, _keep_scope(needed, keep)
    return store, reject


def agree_on_checkpoint(
    cfg: CkptConfig,
    log: OpsLog,
    group: Group,
    name: str,
    reads: tuple[str, ...],
    needed: Needed,
    epoch: int | None = None,
    *,
    store: CheckpointStore | None = None,
    fs: LocalFS | None = None,
    mapped: bool = True,
    timeout_s: float | None = None,
    node_local: bool = True,
    keep: Keep = None,
) -> Chosen | None:
    """Steps 1 to 3 of the module docstring on every process: the primary's choice, verified everywhere (or,
    when each process's ``ckpt_directory`` is its own, :mod:`~candle_ckpt.engine.node_restore`'s); round N of
    the choice meets at ``name/N``.

    Args:
        name: This restore's meeting point prefix (``group.meeting("restore")``).
        reads: The files this process loads into memory.
        needed: ``needed(where)``: the files of the sharded checkpoint ``where`` this process reads.
        keep: ``keep(names)``: of a sharded checkpoint's files, those it loads from whole (within ``needed``):
            read once, for their CRC and their values, and returned (``bytes``) in the chosen one's contents.
        epoch: Exactly this epoch (``ckpt_restart_epoch`` otherwise), as ``select_checkpoint``.
        store: The primary's own store, when its writer holds the lock (a pull from the persistent tier then
            commits through it); None: a store of its own (with ``fs``).
        mapped: The files read as read-only mmaps (``CheckpointStore.verify``), else bytes.
        timeout_s: The bound on each meeting point (:func:`~candle_ckpt.engine.group_commit.group_timeout`).
        node_local: False where only the primary commits (``tf.distribute``): a ``ckpt_directory`` that is
            each process's own is then refused when there is something to restore (see ``node_restore.meet``).

    Returns:
        The verified checkpoint (the same on every process), or None when there is none.

    Raises:
        NoValidCheckpoint: the primary could not choose (on every process), e.g. none left after the rejections.
        GroupTimeout: a process did not come to a meeting point in time (naming it and the missing ranks).
    """
    bound = group_timeout() if timeout_s is None else timeout_s
    ahead = None if is_primary(group) else _prefetch(cfg, keep)  # the primary reads its part while choosing
    with ahead if ahead is not None else contextlib.nullcontext():
        word, decision = node_restore.meet(cfg, log, group, name, steps=True, timeout_s=bound, node_local=node_local,
                                           wanted=epoch if epoch is not None else cfg.restart_epoch)  # fmt: skip
        verify = lambda said: _verify_choice(cfg, said, reads, needed, keep, ahead, mapped)  # noqa: E731
        if word != node_restore.SHARED:
            return node_restore.agree_node_local(cfg, log, group, name, word, decision, verify, timeout_s=bound)
        if not is_primary(group):
            return _agree_shared(group, log, name, None, verify, bound)
    store, reject = _primary_store(cfg, needed, keep, store, fs)

    def select() -> Chosen | None:
        return select_checkpoint(cfg, log, reads=reads, epoch=epoch, mapped=mapped, steps=True, store=store)

    try:
        return _agree_shared(group, log, name, (select, reject), verify, bound)
    finally:
        store.crc_scope = store.keep_scope = None  # the writer's store goes on without this restore's scopes


def _agree_shared(
    group: Group, log: OpsLog, name: str, primary: Primary | None, verify: Callable[[str], Chosen], bound: float
) -> Chosen | None:
    """Steps 2 and 3 in a shared ``ckpt_directory``; ``primary``: the primary's ``(select, reject)``, None on
    the others (``select()`` chooses, ``reject(said, reasons)`` rules out a checkpoint some process failed)."""
    for attempt in itertools.count():
        key, held = f"{name}/{attempt}", []

        def choose(held: list[Chosen | None] = held) -> str:
            held.append(primary[0]())
            return _choice(held[0])

        said = node_restore.primary_says(group, f"{key}/choice", choose if primary else None, bound)
        if said == "none":
            return None
        mine = held[0] if held else None  # the primary's, verified while choosing
        check = (lambda m=mine: m) if mine is not None else (lambda s=said: verify(s))
        chosen, reasons = node_restore.verify_together(group, log, f"{key}/verified", check, bound)
        if not reasons:
            return chosen
        if primary is not None:
            primary[1](said, reasons)
    return None  # not reached: itertools.count() is endless
