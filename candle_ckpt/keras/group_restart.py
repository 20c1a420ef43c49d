"""``restart()`` in a multi-process JAX job: the primary chooses, every process verifies, all load or none.

Call it on every process (the same script everywhere). The order:

1. the primary (process 0) chooses the checkpoint exactly as a one-process
   ``restart()`` does (``last``, the CRC fallback to older ones, a newer step
   checkpoint), except that of a sharded checkpoint it checks the CRC of the
   files it will read itself (the manifest, its training state, the parts
   holding its slices) and only the size of the others; it broadcasts its
   choice over the job's group;
2. every other process verifies the files of that exact checkpoint it will
   read (size and CRC), and the processes ``exchange`` the outcome: if one
   failed, the primary rejects that checkpoint (logging why, in every
   process's words) and chooses again, every process with it, until all
   agree or nothing is left. No byte is CRC-checked twice, and no process
   reads a part it does not need;
3. each process reads its slices (a sharded checkpoint) or the whole file (a
   one-process ``model.keras``) into the variables' current shardings, and only
   when every process has read its part does any process assign.

What is restored is attached to the model, as by the one-process ``restart()``,
including this process's training state (``train.state.pRRRRR.npz``).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CorruptCheckpoint, NoValidCheckpoint
from candle_ckpt.core.group import Group
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.pending import Pending
from candle_ckpt.engine.resume import (
    Chosen,
    Resumed,
    attach_resumed,
    checkpoint_dir,
    load_chosen,
    select_checkpoint,
)
from candle_ckpt.keras import internals, node_restore
from candle_ckpt.keras.adapter import KerasModelAdapter
from candle_ckpt.keras.preflight import build_optimizer
from candle_ckpt.keras.sharded import files_to_read, load_sharded, train_state_part
from candle_ckpt.storage.sharded import MANIFEST
from candle_ckpt.storage.store import CheckpointStore


class GroupModelAdapter:
    """Restore one Keras model on one process of a group (see the module docstring)."""

    def __init__(self, model: Any, group: Group, name: str) -> None:
        self.model, self.group, self.name = model, group, name
        self.reads = tuple(dict.fromkeys((train_state_part(group.rank), *KerasModelAdapter.reads)))
        self.pending = Pending()
        self.read_stats: dict[str, int] = {}  # what this process read (load_sharded's stats), for the load record

    def restore(self, chosen: Chosen, log: OpsLog, where: str) -> None:
        contents = chosen.contents
        if chosen.sidecar.model_file != MANIFEST:  # a one-process checkpoint: every process loads the same file
            one = KerasModelAdapter(self.model)
            one.restore(chosen, log, where)
            self.pending = one.pending
            self.group.barrier(f"{self.name}/loaded", group_timeout())
            return

        def agree(ok: bool) -> bool:
            return self.group.all_agree(f"{self.name}/read", ok, group_timeout())

        self.pending = load_sharded(self.model, contents, where, log, self.group.rank, agree, self.read_stats)


def _choice(chosen: Chosen | None) -> str:
    if chosen is None:
        return "none"
    kind = "step" if chosen.sidecar.step is not None else "epoch"
    return f"{kind}:{chosen.epoch}:{chosen.sidecar.generation}"


def _where(layout: L.Layout, said: str) -> str:
    """The directory of the checkpoint a choice names (``epoch:E:G`` or ``step:E:G``)."""
    kind, epoch, generation = said.split(":")
    return layout.step_dir(int(generation)) if kind == "step" else layout.epoch_dir(int(epoch))


def _verify_choice(cfg: CkptConfig, said: str, reads: tuple[str, ...], needed: Callable[[str], set[str]]) -> Chosen:
    """The checkpoint the primary chose, verified on this process: of a sharded one, only ``needed(where)``."""
    kind, epoch, generation = said.split(":")
    store = CheckpointStore.of(cfg)
    if kind == "step":
        where, side = store.layout.step_dir(int(generation)), store.steps.read_sidecar(int(generation))
    else:
        where, side = store.layout.epoch_dir(int(epoch)), store.read_sidecar(int(epoch))
        if side.generation != int(generation):
            raise NoValidCheckpoint(
                f"{where}: generation {side.generation} on disk, but the primary chose generation {generation} "
                "(is ckpt_directory on a file system shared by every process?)"
            )
    if side.model_file == MANIFEST:  # the manifest, this process's state and the parts of its slices
        wanted = needed(where)
        contents = store.verify_files(where, replace(side, files={k: e for k, e in side.files.items() if k in wanted}),
                                      reads=reads, mapped=True)  # fmt: skip
    else:
        contents = store.verify_files(where, side, reads=reads, mapped=True)
    return Chosen(int(epoch), side, contents)


def _primary_store(cfg: CkptConfig, needed: Callable[[str], set[str]], rejected: dict[str, str]) -> CheckpointStore:
    """The primary's store for choosing: of a sharded checkpoint it checks the CRC of the files it reads (and the
    size of every file), the others check theirs; a checkpoint another process rejected is skipped, with why."""
    store = CheckpointStore.of(cfg)

    def scope(directory: str, side: Any) -> set[str] | None:
        if directory in rejected:
            raise CorruptCheckpoint(directory, rejected[directory])
        return needed(directory) if side.model_file == MANIFEST else None

    store.crc_scope = scope
    return store


def agree_on_checkpoint(
    cfg: CkptConfig,
    log: OpsLog,
    group: Group,
    name: str,
    reads: tuple[str, ...],
    needed: Callable[[str], set[str]],
    epoch: int | None = None,
) -> Chosen | None:
    """Steps 1 and 2 of the module docstring on every process: the primary's choice, verified everywhere (or,
    when each process's ``ckpt_directory`` is its own, :mod:`~candle_ckpt.keras.node_restore`'s).

    Each process checks the CRC of the files it reads (the primary while choosing, and only the size of the
    others' files); if one cannot, the primary rejects that checkpoint, logging every process's reason, and
    chooses again (round N meets at ``name/N``), every process with it.

    Args:
        name: This restore's meeting point prefix (``group.meeting("restore")``).
        reads: The files this process loads into memory.
        needed: ``needed(where)``: the files of the sharded checkpoint ``where`` this process reads.
        epoch: Exactly this epoch (``ckpt_restart_epoch`` otherwise), as ``select_checkpoint``.

    Returns:
        The verified checkpoint (the same on every process), or None when there is none.

    Raises:
        NoValidCheckpoint: the primary could not choose (on every process), e.g. none left after the rejections.
    """
    # One meeting first: is ckpt_directory shared, or each node's own (then: which tier; keras.node_restore)?
    wanted = epoch if epoch is not None else cfg.restart_epoch
    word, decision = node_restore.meet(cfg, log, group, name, steps=True, wanted=wanted)
    if word != node_restore.SHARED:
        verify = lambda said: _verify_choice(cfg, said, reads, needed)  # noqa: E731
        return node_restore.agree_node_local(cfg, log, group, name, word, decision, verify)
    rejected: dict[str, str] = {}
    store = _primary_store(cfg, needed, rejected) if group.rank == 0 else None
    for attempt in itertools.count():
        key, held = f"{name}/{attempt}", []

        def choose(held: list[Chosen | None] = held) -> str:
            held.append(select_checkpoint(cfg, log, reads=reads, epoch=epoch, mapped=True, steps=True, store=store))
            return _choice(held[0])

        said = node_restore.primary_says(group, f"{key}/choice", choose if group.rank == 0 else None)
        if said == "none":
            return None
        mine = held[0] if held else None  # the primary's, verified while choosing
        verify = (lambda m=mine: m) if mine is not None else (lambda s=said: _verify_choice(cfg, s, reads, needed))
        chosen, reasons = node_restore.verify_together(group, log, f"{key}/verified", verify)
        if not reasons:
            return chosen
        if store is not None:
            rejected[_where(store.layout, said)] = "; ".join(reasons)
    return None  # not reached: itertools.count() is endless


def restart_group(
    cfg: CkptConfig, model: Any, group: Group, logger: str | logging.Logger | None, verbose: bool
) -> dict[str, Any] | None:
    """``restart()`` on one process of ``group`` (call it on every process; see the module docstring).

    ``group`` is this restore's own scope (:func:`~candle_ckpt.core.group.scoped`): closed at the end.
    """
    layout = L.Layout.of(cfg)
    log = OpsLog(layout.log if group.rank == 0 else None, get_logger(logger, verbose))
    # Nothing below may create a Keras variable on only some processes (a collective under a distribution):
    # the skip sets of the plan walk, and the optimizer's variables, are made here, on every process.
    internals.warm_skipsets()
    if getattr(model, "optimizer", None) is not None:
        build_optimizer(model)
    name = group.meeting("restore")
    adapter = GroupModelAdapter(model, group, name)
    reads = adapter.reads
    start = time.perf_counter()
    attach_resumed(model, None)
    chosen = agree_on_checkpoint(cfg, log, group, name, reads, lambda where: files_to_read(model, where, group.rank))
    if chosen is None:
        group.close(group_timeout())
        return None
    record = load_chosen(cfg, log, adapter, chosen, time.perf_counter() - start, f"process {group.rank}")
    group.close(group_timeout())  # the last meeting: every key of this restore is deleted
    resumed = Resumed(os.path.realpath(cfg.directory), chosen.sidecar, record, adapter.pending)
    attach_resumed(model, resumed)
    resumed.pending.guard(model, log, checkpoint_dir(layout, chosen.sidecar))
    return chosen.sidecar.to_dict()
