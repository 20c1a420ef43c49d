"""``restart()`` in a multi-process JAX job: the primary chooses, every process verifies, all load or none.

Call it on every process (the same script everywhere). The order:

1. and 2. the choice and its verification, by the one restore driver (:func:`candle_ckpt.engine.restore.restore`)
   through the one protocol of every multi-process job,
   :func:`~candle_ckpt.engine.group_restore.agree_on_checkpoint` (the primary chooses, every process
   verifies the files it will read, a failure anywhere makes the primary fall back, all agree or nothing);
3. each process reads its slices (a sharded checkpoint) or the whole file (a
   one-process ``model.keras``) into the variables' current shardings, and only
   when every process has read its part does any process assign.

What is restored is attached to the model, as by the one-process ``restart()``,
including this process's training state (``train.state.pRRRRR.npz``).

keras/restart.py calls it with the one-process adapter (for a one-process checkpoint, which every process
loads whole) after preparing the model through Keras's internals: this room reaches neither.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.pending import Pending
from candle_ckpt.engine.restore import restore
from candle_ckpt.engine.resume import Chosen, attach_resumed, checkpoint_dir
from candle_ckpt.multihost.load import files_to_read, kept_parts, load_sharded
from candle_ckpt.multihost.save import train_state_part
from candle_ckpt.storage.sharded import MANIFEST


class GroupModelAdapter:
    """Restore one Keras model on one process of a group (see the module docstring).

    ``one_process``: the one-process adapter's class (its ``reads``; made for a one-process checkpoint).
    """

    def __init__(self, model: Any, group: Group, name: str, one_process: Any) -> None:
        self.model, self.group, self.name, self.one_process = model, group, name, one_process
        self.reads = tuple(dict.fromkeys((train_state_part(group.rank), *one_process.reads)))
        self.pending = Pending()
        self.read_stats: dict[str, int] = {}  # what this process read (load_sharded's stats), for the load record

    def restore(self, chosen: Chosen, log: OpsLog, where: str) -> None:
        contents = chosen.contents
        if chosen.sidecar.model_file != MANIFEST:  # a one-process checkpoint: every process loads the same file
            one = self.one_process(self.model)
            one.restore(chosen, log, where)
            self.pending = one.pending
            self.group.barrier(f"{self.name}/loaded", group_timeout())
            return

        def agree(ok: bool) -> bool:
            return self.group.all_agree(f"{self.name}/read", ok, group_timeout())

        self.pending = load_sharded(self.model, contents, where, log, self.group.rank, agree, self.read_stats)


def restart_group(
    cfg: CkptConfig,
    model: Any,
    group: Group,
    logger: str | logging.Logger | None,
    verbose: bool,
    one_process: Any,
    prepare: Callable[[], object] | None = None,
) -> dict[str, Any] | None:
    """``restart()`` on one process of ``group`` (call it on every process; see the module docstring).

    ``group`` is this restore's own scope (:func:`~candle_ckpt.core.group.scoped`): closed at the end.
    ``model``'s optimizer, if it has one, is built, on every process (nothing below may create a Keras
    variable on only some processes: under a distribution that is a collective): ``prepare`` does it, under the
    restore's hang watch, as every meeting below is (a meeting that times out exits 124, as a hang does).
    ``one_process``: see :class:`GroupModelAdapter`.
    """
    layout = L.Layout.of(cfg)
    log = OpsLog(layout.log if is_primary(group) else None, get_logger(logger, verbose))
    name = group.meeting("restore")
    adapter = GroupModelAdapter(model, group, name, one_process)
    attach_resumed(model, None)
    needed = lambda where: files_to_read(model, where, group.rank)  # noqa: E731
    keep = lambda names: kept_parts(names, group.rank)  # noqa: E731
    resumed = restore(
        cfg, log, adapter, group=group, name=name, mapped=True, who=f"process {group.rank}", needed=needed, keep=keep,
        prepare=prepare, timeout_exits=True,
    )  # fmt: skip
    group.close(group_timeout())  # the last meeting: every key of this restore is deleted
    if resumed is None:
        return None
    attach_resumed(model, resumed)
    resumed.pending.guard(model, log, checkpoint_dir(layout, resumed.sidecar))
    return resumed.sidecar.to_dict()
