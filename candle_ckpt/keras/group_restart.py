"""``restart()`` in a multi-process JAX job: the primary chooses, every process verifies, all load or none.

Call it on every process (the same script everywhere). The order:

1. the primary (process 0) chooses the checkpoint exactly as a one-process
   ``restart()`` does (``last``, the CRC fallback to older ones, a newer step
   checkpoint) and broadcasts its choice over the job's group;
2. every other process verifies that exact checkpoint (size and CRC of its
   files) on its side, and ``all_agree`` tells every process whether all did:
   if one failed, every process raises and none loads anything;
3. each process reads its slices (a sharded checkpoint) or the whole file (a
   one-process ``model.keras``) into the variables' current shardings, and only
   when every process has read its part does any process assign.

What is restored is attached to the model, as by the one-process ``restart()``,
including this process's training state (``train.state.pRRRRR.npz``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, NoValidCheckpoint
from candle_ckpt.core.group import Group
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.engine.group_commit import group_timeout, meeting
from candle_ckpt.engine.pending import Pending
from candle_ckpt.engine.resume import (
    Chosen,
    Resumed,
    attach_resumed,
    checkpoint_dir,
    load_chosen,
    select_checkpoint,
)
from candle_ckpt.keras import internals
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

        self.pending = load_sharded(self.model, contents, where, log, self.group.rank, agree)


def _choice(chosen: Chosen | None) -> str:
    if chosen is None:
        return "none"
    kind = "step" if chosen.sidecar.step is not None else "epoch"
    return f"{kind}:{chosen.epoch}:{chosen.sidecar.generation}"


def _verify_choice(cfg: CkptConfig, said: str, reads: tuple[str, ...], needed: Callable[[str], set[str]]) -> Chosen:
    """The checkpoint the primary chose, verified on this process: of a sharded one, only ``needed(where)``."""
    kind, epoch, generation = said.split(":")
    store = CheckpointStore(cfg.directory, checksum=cfg.checksum, flat=cfg.layout == "flat")
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


def agree_on_checkpoint(
    cfg: CkptConfig,
    log: OpsLog,
    group: Group,
    name: str,
    reads: tuple[str, ...],
    needed: Callable[[str], set[str]],
    epoch: int | None = None,
) -> Chosen | None:
    """Steps 1 and 2 of the module docstring on every process: the primary's choice, verified everywhere.

    Args:
        name: This restore's meeting point prefix (:func:`~candle_ckpt.engine.group_commit.meeting`).
        reads: The files this process loads into memory.
        needed: ``needed(where)``: the files of the sharded checkpoint ``where`` this process reads.
        epoch: Exactly this epoch (``ckpt_restart_epoch`` otherwise), as ``select_checkpoint``.

    Returns:
        The verified checkpoint (the same on every process), or None when there is none.

    Raises:
        NoValidCheckpoint: the primary could not choose, or a process could not verify (on every process).
    """
    chosen, said = None, None
    if group.rank == 0:
        try:
            chosen = select_checkpoint(cfg, log, reads=reads, epoch=epoch, mapped=True, steps=True)
            said = _choice(chosen)
        except Exception as err:  # told to the others before raising, so none waits for nothing
            said = f"error:{err}"
            group.broadcast(f"{name}/choice", said, group_timeout())
            raise
    said = group.broadcast(f"{name}/choice", said, group_timeout())
    if said.startswith("error:"):
        raise NoValidCheckpoint(f"the primary (process 0) could not choose a checkpoint: {said[6:]}")
    if said == "none":
        return None
    failure = None
    if chosen is None:
        try:
            chosen = _verify_choice(cfg, said, reads, needed)
        except (CheckpointError, ValueError, OSError) as err:  # told to the others: all load, or none
            failure = err
    if not group.all_agree(f"{name}/verified", failure is None, group_timeout()):
        detail = f": {failure}" if failure is not None else " (see its log)"
        raise NoValidCheckpoint(
            f"a process could not verify the checkpoint the primary chose ({said}){detail}; "
            "nothing was loaded on any process"
        )
    return chosen


def restart_group(
    cfg: CkptConfig, model: Any, group: Group, logger: str | logging.Logger | None, verbose: bool
) -> dict[str, Any] | None:
    """``restart()`` on one process of ``group`` (call it on every process; see the module docstring)."""
    layout = L.Layout.at(cfg.directory, flat=cfg.layout == "flat")
    log = OpsLog(layout.log if group.rank == 0 else None, get_logger(logger, verbose))
    # Nothing below may create a Keras variable on only some processes (a collective under a distribution):
    # the skip sets of the plan walk, and the optimizer's variables, are made here, on every process.
    internals.warm_skipsets()
    if getattr(model, "optimizer", None) is not None:
        build_optimizer(model)
    name = meeting("restore")
    adapter = GroupModelAdapter(model, group, name)
    reads = adapter.reads
    start = time.perf_counter()
    attach_resumed(model, None)
    chosen = agree_on_checkpoint(cfg, log, group, name, reads, lambda where: files_to_read(model, where, group.rank))
    if chosen is None:
        return None
    record = load_chosen(cfg, log, adapter, chosen, time.perf_counter() - start, f"process {group.rank}")
    resumed = Resumed(os.path.realpath(cfg.directory), chosen.sidecar, record, adapter.pending)
    attach_resumed(model, resumed)
    resumed.pending.guard(model, log, checkpoint_dir(layout, chosen.sidecar))
    return chosen.sidecar.to_dict()
