"""The one restore driver: choose, verify and load the checkpoint a job resumes from, for every front end.

``restart()`` (one Keras 3 model, or a JAX process group), :class:`~candle_ckpt.runner.job.JobRunner` and
:class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState` call :func:`restore` with their config, their
:class:`~candle_ckpt.core.group.Group` (``SOLO`` for one process) and the adapter that loads; it returns what
was resumed (:class:`~candle_ckpt.engine.resume.Resumed`), or None. Adopting it (best tracking, lineage, no
prune of it) is :class:`~candle_ckpt.engine.run.TrainingRun`'s, once.

The order:

1. the restart history is read (:mod:`candle_ckpt.engine.restart_history`), by every process before the
   first meeting, so that all of a group decide alike and none reads what the primary appends after; a
   restore that hung in the starts before this one is refused here, before anything is read
   (:func:`~candle_ckpt.engine.restart_history.refuse_hung_restore`);
2. the choice and its verification: one process, :func:`~candle_ckpt.engine.resume.select_checkpoint`; a
   group, :func:`~candle_ckpt.engine.group_restore.agree_on_checkpoint` (the primary chooses, all verify);
3. a crash loop is refused (:func:`~candle_ckpt.engine.restart_history.refuse_crash_loop`, exit status 65);
4. the load through the adapter (:func:`~candle_ckpt.engine.resume.load_chosen`);
5. the primary appends the ``restart`` record, with the start's breakdown: ``import_s`` (process start to
   here), ``choose_s``, ``verify_s`` (this process's CRC reads through its store), ``read_s`` (the load),
   ``restore_s`` (their sum); the first step adds ``first_step_s``.

Steps 1 to 4 run under a hang watchdog of their own (:func:`~candle_ckpt.engine.watchdog.watched`, phase
``restore``; ``ckpt_hang_timeout``: auto's limit is :data:`~candle_ckpt.engine.watchdog.START_S`), from the
first read on (a mount that stopped answering whole blocks the history's), where progress is a byte read or
written (:class:`~candle_ckpt.engine.watchdog.ReadMeter`), so that a long pull or a large file is never taken
for a hang. A read that never returns (a file system that stopped answering) ends the process with status 124
and every thread's stack in ``ckpt.log`` (where that file cannot be written either: on stderr only), after the
primary appended a ``restart`` record of the checkpoint it was verifying or reading and its ``failure``
(``hang``, phase ``restore``; nothing, where the history cannot be written). The Slurm script requeues it;
the same recorded hang after every requeue is refused at step 1 once ``ckpt_max_no_progress_restarts`` is
reached. The front end's own work before the first read runs under the same watch (``prepare``: in a JAX
group, ``restart()`` builds the optimizer's variables, a collective that waits for every process). A meeting
of a group that times out (``CANDLE_CKPT_GROUP_TIMEOUT_S``: a peer stuck before or inside its restore, or gone)
is a hang too where the front end asks (``timeout_exits``: ``restart()``, of a JAX group or of ``tf.distribute``
workers, and ``JobRunner.train()``, whose callers have nothing to catch it) and the watchdog is on: the same
block, record and exit status 124, naming the meeting point and the ranks that never came. Elsewhere it raises
:class:`~candle_ckpt.core.errors.GroupTimeout` (``WorkerTrainingState``'s callers handle it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import history as H
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import GroupTimeout
from candle_ckpt.core.group import SOLO, Group, is_primary
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine import restart_history
from candle_ckpt.engine.decision import hang_timeout
from candle_ckpt.engine.group_restore import Keep, Needed, agree_on_checkpoint
from candle_ckpt.engine.pending import Pending
from candle_ckpt.engine.resume import Adapter, Chosen, Resumed, close_chosen, load_chosen, select_checkpoint
from candle_ckpt.engine.watchdog import watched
from candle_ckpt.storage.store import CheckpointStore


class _VerifyClock:
    """Times a store's ``verify_files`` (the CRC reads) while a restore chooses through it, and tells ``watch``
    which checkpoint it reads (its sidecar, then its files)."""

    def __init__(self, store: CheckpointStore | None, watch: _RestoreWatch) -> None:
        self.store, self.spent = store, 0.0
        if store is None:
            return
        inner, epoch_side, step_side = store.verify_files, store.read_sidecar, store.steps.read_sidecar

        def verify_files(directory: str, side: Sidecar, **kwargs: Any) -> Any:
            watch.reading(directory, side)
            began = time.perf_counter()
            try:
                return inner(directory, side, **kwargs)
            finally:
                self.spent += time.perf_counter() - began

        def read_sidecar(epoch: int) -> Sidecar:
            watch.reading(store.layout.epoch_dir(epoch))
            return epoch_side(epoch)

        def read_step_sidecar(generation: int) -> Sidecar:
            watch.reading(store.layout.step_dir(generation))
            return step_side(generation)

        store.verify_files, store.read_sidecar = verify_files, read_sidecar  # type: ignore[method-assign]
        store.steps.read_sidecar = read_step_sidecar  # type: ignore[method-assign]

    def __enter__(self) -> _VerifyClock:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.store is not None:  # the store's own methods again
            del self.store.verify_files, self.store.read_sidecar, self.store.steps.read_sidecar


class _RestoreWatch:
    """Steps 1 to 4 under the hang watchdog (module docstring): armed on entry, stopped on exit."""

    def __init__(
        self, cfg: CkptConfig, history: restart_history.History, group: Group, breakdown: dict, exits: bool
    ) -> None:
        self.cfg, self.history, self.breakdown, self.exits = cfg, history, breakdown, exits
        self.name: str | None = None  # the checkpoint being read (for the hang's record), and its sidecar
        self.side: Sidecar | None = None
        layout = L.Layout.of(cfg)
        self.ckpts = layout.ckpts
        who = f"process {group.rank} of {group.size}" if group.size > 1 else ""
        self._watch = watched(hang_timeout(cfg), layout.log, "restore", self._record, who=who, group=group)

    def __enter__(self) -> _RestoreWatch:
        self.watchdog = self._watch.__enter__()
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: object) -> None:
        self._watch.__exit__(kind, value, tb)
        if self.exits and self.watchdog.on and isinstance(value, GroupTimeout):  # a peer stuck or gone: a hang
            self.watchdog.fire(value.timeout_s, value.timeout_s, how=f"CANDLE_CKPT_GROUP_TIMEOUT_S: {value}")

    def reading(self, directory: str, side: Sidecar | None = None) -> None:
        """The restore reads the checkpoint in ``directory`` now (``side``: its sidecar, once read)."""
        self.name, self.side = os.path.relpath(directory, self.ckpts).replace(os.sep, "/"), side

    def _record(self, error: str, phase: str) -> None:
        """The hang's records (the primary's; from the watchdog's reporter thread, bounded by it)."""
        record = _restart_record(self.name, self.side, None, self.breakdown)
        self.history.append(record)
        self.history.append(H.new_record("failure", restart=record["id"], error=error, phase=phase,
                                          process=restart_history.process_token()))  # fmt: skip


def restore(
    cfg: CkptConfig,
    log: OpsLog,
    adapter: Adapter,
    *,
    group: Group = SOLO,
    name: str | None = None,
    epoch: int | None = None,
    fs: Any = None,
    store: CheckpointStore | None = None,
    mapped: bool = False,
    who: str = "",
    needed: Needed = None,
    keep: Keep = None,
    timeout_s: float | None = None,
    node_local: bool = True,
    prepare: Callable[[], object] | None = None,
    timeout_exits: bool = False,
) -> Resumed | None:
    """Choose, verify and load the checkpoint to resume from (the module docstring's order).

    Args:
        cfg, log: The job's configuration (the restart mode and epoch, the tiers, the crash-loop limit), its log.
        adapter: What loads (``reads``, ``restore(chosen, log, where)``; its ``pending``, ``read_stats``).
        group: The job's processes (``SOLO``: one); call it on every one.
        name, epoch: The group's meeting point prefix (``group.meeting("restore")``); exactly this epoch.
        fs, store: The file-system seam of a store made here; the writer's own store, when it holds the lock.
        mapped, who: The files read as read-only mmaps; how this process is named in a group's load line.
        needed, keep, timeout_s, node_local: A group's (:func:`~candle_ckpt.engine.group_restore.agree_on_checkpoint`).
        prepare: The front end's own work before the first read, watched with the rest (module docstring).
        timeout_exits: A meeting that times out is a hang (exit 124; ``restart()``, ``JobRunner``); else it raises.

    Returns:
        What was resumed, or None (nothing to resume from; the mode allows it).

    Raises:
        NoValidCheckpoint: ``required`` mode or an exact epoch, and none valid.
        SystemExit: a crash loop refused (status :data:`~candle_ckpt.core.history.CRASH_LOOP_EXIT`).
        GroupTimeout: a meeting timed out (unless ``timeout_exits``).
    """
    breakdown: dict[str, Any] = {}
    history = restart_history.History(cfg, log, writes=is_primary(group))
    with _RestoreWatch(cfg, history, group, breakdown, timeout_exits) as watch:  # from the first read on
        (prepare or _nothing)()
        began = time.perf_counter()
        breakdown["import_s"] = restart_history.seconds_since_process_start()
        records = history.records()
        restart_history.refuse_hung_restore(cfg, history, records)
        if is_primary(group):  # SOLO is its own primary
            store = store if store is not None else CheckpointStore.of(cfg, fs=fs)
        with _VerifyClock(store, watch) as clock:
            chosen = _choose(cfg, log, adapter, group, name, epoch, store, mapped, needed, keep, timeout_s, node_local)
        chose = time.perf_counter() - began
        breakdown.update(choose_s=round(max(0.0, chose - clock.spent), 3), verify_s=round(clock.spent, 3))
        if chosen is None:
            breakdown.update(read_s=0.0, restore_s=round(chose, 3))
            _recorded(history, None, breakdown)
            return None
        watch.name, watch.side = restart_history.resumed_name(L.Layout.of(cfg), chosen.sidecar), chosen.sidecar
        return _load(cfg, log, adapter, chosen, watch.name, history, records, breakdown, began, who)


def _nothing() -> None:
    """No front-end work before the first read."""


def _load(
    cfg: CkptConfig,
    log: OpsLog,
    adapter: Adapter,
    chosen: Chosen,
    name: str,
    history: restart_history.History,
    records: list[dict[str, Any]],
    breakdown: dict[str, Any],
    began: float,
    who: str,
) -> Resumed:
    """Steps 3 to 5: a crash loop refused, else the load, then the record (``name``: the history's name of
    ``chosen``)."""
    try:
        restart_history.refuse_crash_loop(cfg, history, records, name, chosen.sidecar)
    except SystemExit:
        close_chosen(chosen)
        raise
    load = load_chosen(cfg, log, adapter, chosen, time.perf_counter() - began, who)
    breakdown.update(read_s=round(load["load_s"], 3), restore_s=round(time.perf_counter() - began, 3))
    pending = getattr(adapter, "pending", None) or Pending()  # what the adapter applies when training starts
    resumed = Resumed(os.path.realpath(cfg.directory), chosen.sidecar, load, pending)
    resumed.start = breakdown
    resumed.source = "persistent" if chosen.sidecar.extra.get("pulled_from") else "fast"
    _recorded(history, resumed, breakdown, name)
    return resumed


def _choose(
    cfg: CkptConfig,
    log: OpsLog,
    adapter: Adapter,
    group: Group,
    name: str | None,
    epoch: int | None,
    store: CheckpointStore | None,
    mapped: bool,
    needed: Needed,
    keep: Keep,
    timeout_s: float | None,
    node_local: bool,
) -> Chosen | None:
    """Step 2: one process chooses alone (a step checkpoint newer than ``last`` first); a group agrees."""
    reads = tuple(adapter.reads)
    if group.size == 1:
        return select_checkpoint(cfg, log, reads=reads, epoch=epoch, mapped=mapped, store=store, steps=True)
    name = name if name is not None else group.meeting("restore")
    return agree_on_checkpoint(
        cfg, log, group, name, reads, needed, epoch,
        store=store, mapped=mapped, timeout_s=timeout_s, node_local=node_local, keep=keep,
    )  # fmt: skip


def _restart_record(name: str | None, side: Sidecar | None, source: str | None, breakdown: dict) -> dict[str, Any]:
    """A ``restart`` record of ``name`` (``side``: its sidecar), with the start's ``breakdown`` so far."""
    return H.new_record(
        "restart",
        resumed=name,
        epoch=side.epoch if side is not None else None,
        step=side.step if side is not None else None,
        generation=side.generation if side is not None else None,
        source=source,
        lineage=side.lineage if side is not None else None,
        start=dict(breakdown),
        process=restart_history.process_token(),
    )


def _recorded(
    history: restart_history.History, resumed: Resumed | None, breakdown: dict[str, Any], name: str | None = None
) -> None:
    """Step 5: the ``restart`` record (the primary writes it), and this process's start."""
    side = resumed.sidecar if resumed is not None else None
    record = _restart_record(name, side, resumed.source if resumed is not None else None, breakdown)
    # Written now where a history exists. Else (a job that never failed) only once the run gets somewhere: at its
    # first step (a resume), or with its failure, so that a run that trains nothing (a finished run's rerun, a
    # stop condition already met) and a first fresh start leave no file beside the checkpoints.
    if side is not None and restart_history.finished(history.cfg, side):
        return
    written = os.path.exists(history.path)
    if written:
        history.append(record)
    restart_history.began(record, breakdown, history, written=written)
