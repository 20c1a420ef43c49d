"""``WorkerTrainingState``: checkpoint/restart under ``tf.distribute`` (imports tensorflow lazily).

Follows Keras 2's ``keras/distribute/worker_training_state.py``, on top of the crash-safe store:

* **Every worker takes part in every save**, at the same epoch (reading a distributed
  variable may be a collective); the save decision comes from the same all-reduced logs
  on every worker, so they agree without talking.
* **Only the chief writes to ``ckpt_directory``**: it commits, prunes and appends to
  ``ckpt.log``. Every other worker writes the same files into
  ``ckpts/.tmp-worker-<task_id>/`` and removes it at once (``.tmp-*`` is debris to a restart).
  The engine is told so by its topology, got from the workers' group
  (:func:`~candle_ckpt.engine.topology.mirrored`: the chief is the group's primary).
* **Every worker restores the checkpoint the chief chose**, through the one restore protocol
  of every multi-process job (:mod:`candle_ckpt.engine.group_restore`, the same as for JAX
  processes) over the workers' :class:`~candle_ckpt.core.group.Group` on TensorFlow's
  coordination service (:mod:`candle_ckpt.distributed.tf_group`; the chief is rank 0): the
  chief chooses and says which, each worker verifies that exact checkpoint's CRCs, the
  workers exchange the outcome, and only then does any worker load it. A worker that cannot
  verify it makes the chief reject it and choose again (an older one), every worker with
  it. Workers choosing on their own could load different epochs and diverge.

``ckpt_directory`` must be on a file system every worker can read (as for Keras's
``BackupAndRestore``); the restore's first meeting checks it. Each meeting point of the
restore is bounded by ``collective_timeout_s`` (``CANDLE_CKPT_GROUP_TIMEOUT_S``); training collectives
are bounded by the strategy's ``CommunicationOptions`` and TensorFlow's coordination service.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import CheckpointError, GroupTimeout
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.group import Group, is_primary, scoped
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.distributed.cluster import WorkerInfo, multi_worker_strategy, worker_info
from candle_ckpt.distributed.tf_group import tf_group
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.restore import restore
from candle_ckpt.engine.resume import Resumed
from candle_ckpt.engine.run import adopt
from candle_ckpt.engine.topology import MirroredWorkers, mirrored
from candle_ckpt.storage.store import CheckpointStore

__all__ = ["WorkerInfo", "WorkerTrainingState", "multi_worker_strategy", "worker_info"]


class WorkerTrainingState:
    """Back up and restore one worker's training state under ``tf.distribute``.

    Create it on every worker, after building the model (and optimizer) in
    ``strategy.scope()``; call :meth:`restore` before training and
    :meth:`back_up` at the end of every epoch, on every worker.

    Args:
        gParameters: The job's parameters (``ckpt_*`` keys).
        model: A Keras 3 or tf_keras model (not needed if ``adapter`` is given).
        strategy: The ``tf.distribute`` strategy; by default the model's.
        adapter: What to capture and restore: any object with
            ``reads``, ``capture(cfg) -> Capture`` and
            ``restore(chosen, log, where)`` (the epoch runner is one).
        logger, verbose: As for :class:`~candle_ckpt.keras.callback.CandleCheckpointCallback`.
        fs: File-system operations of the chief's store (tests inject faults).
        writable: False for a restore-only object (``restart()``): the chief
            then does not take the directory's writer lock.
        collective_timeout_s: Bound on each meeting point of :meth:`restore`
            (seconds; None: ``CANDLE_CKPT_GROUP_TIMEOUT_S``, 300 by default, as every
            group's); a worker that waits longer raises GroupTimeout, naming
            the point and the workers that never came, instead of hanging.

    Raises:
        ValueError: several workers are configured but ``strategy`` is not a
            multi-worker strategy, or a parameter is invalid.
    """

    def __init__(
        self,
        gParameters: Mapping[str, Any],
        model: Any = None,
        strategy: Any = None,
        *,
        adapter: Any = None,
        logger: str | logging.Logger | None = "DEFAULT",
        verbose: bool = True,
        fs: LocalFS | None = None,
        writable: bool = True,
        collective_timeout_s: float | None = None,
    ) -> None:
        self.cfg = CkptConfig.from_params(gParameters)
        if adapter is None:
            # This layer imports no adapter: candle_ckpt.WorkerTrainingState picks one for a model.
            raise TypeError(
                "WorkerTrainingState needs an adapter; candle_ckpt.WorkerTrainingState picks one for a model"
            )
        self.adapter = adapter
        if strategy is None and model is not None:
            strategy = getattr(model, "distribute_strategy", None)
        self.strategy = strategy
        self.info = worker_info(strategy)
        if self.info.num_workers > 1 and getattr(strategy, "cluster_resolver", None) is None:
            raise ValueError(
                f"the cluster has {self.info.num_workers} workers (TF_CONFIG) but strategy {strategy!r} is not a "
                "multi-worker strategy; build the model in MultiWorkerMirroredStrategy().scope() or pass it"
            )
        if collective_timeout_s is None:
            collective_timeout_s = group_timeout()
        number = isinstance(collective_timeout_s, (int, float)) and not isinstance(collective_timeout_s, bool)
        if not (number and collective_timeout_s > 0):
            raise ValueError(f"collective_timeout_s must be a number > 0 (seconds); got {collective_timeout_s!r}")
        self.timeout_s = float(collective_timeout_s)
        self.cfg = self.cfg.resolved()  # ckpt_async=auto: asynchronous
        self.layout = Layout.of(self.cfg)
        # Non-chief scratch space: a ".tmp-*" name is debris to the store and never read by a restart.
        scratch = os.path.join(self.layout.ckpts, f".tmp-worker-{self.info.task_id}")
        self.topology: MirroredWorkers = mirrored(self._chief_first(), scratch)
        self.log = OpsLog(self.layout.log if self.topology.primary else None, get_logger(logger, verbose))
        self.fs = fs or LocalFS()
        self.temp_dir = self.topology.scratch_dir
        self.restored_epoch: int | None = None
        # What restore() loaded; restart() attaches it to the model for the callback.
        self.resumed: Resumed | None = None
        self.load: dict[str, Any] | None = None
        self.engine: CheckpointEngine | None = None
        if writable:
            # The chief opens the store now: it locks the directory and removes
            # debris before any worker starts writing its temporary directory.
            self.engine = CheckpointEngine(self.cfg, self.log, fs=self.fs, topology=self.topology)

    @property
    def is_chief(self) -> bool:
        return self.topology.primary

    def _chief_first(self) -> Group:
        """The workers' group, checked against the cluster's own word: the chief is rank 0, the primary."""
        group = self.group
        # TensorFlow numbers the chief task, or worker 0 when the cluster has none, 0 (multi_worker_util.id_in_cluster),
        # as worker_info names the chief.
        if is_primary(group) != self.info.is_chief:
            raise CheckpointError(
                f"{self.info.name} has rank {group.rank} in the workers' group but "
                f"is_chief={self.info.is_chief}; the chief must be rank 0"
            )
        return group

    @functools.cached_property
    def group(self) -> Group:
        """The workers as a :class:`~candle_ckpt.core.group.Group` (the chief is rank 0; one worker: SOLO), over
        which the restore and each fit's preemption agreement meet (each in a scope of its own)."""
        return tf_group(self.strategy, self.info.num_workers)

    # -- saving ----------------------------------------------------------------------
    def back_up(self, epoch: int, logs: Mapping[str, Any] | None = None, *, reason: str | None = None) -> bool:
        """Save ``epoch`` (completed epochs) if the policy says so; call it on every worker.

        Every worker makes the same decision from the same (all-reduced) logs
        and takes its snapshot at the same point. The chief commits it; any
        other worker writes it into its temporary directory and removes it.
        With ``ckpt_async_save`` both writes run on the background writer.

        Args:
            epoch: Completed epochs (the checkpoint's number).
            logs: This epoch's metrics, the same on every worker.
            reason: Save whatever the policy says (e.g. ``"init"`` for epoch 0).

        Returns:
            True if this worker took a snapshot and started its write.
        """
        if self.engine is None:
            raise CheckpointError("this WorkerTrainingState was created with writable=False; it cannot back_up()")
        return self.engine.save(epoch, dict(logs or {}), lambda: self.adapter.capture(self.cfg), reason=reason)

    def finish(self, timeout: float | None = None) -> None:
        """Wait for the write in flight (``ckpt_async_save``); raise its error per ``ckpt_on_error``."""
        if self.engine is not None:
            self.engine.finish(timeout)

    def delete_backup(self, *, remove_checkpoints: bool = False) -> None:
        """Clean up after training: this worker's temporary directory, and with
        ``remove_checkpoints=True`` (Keras's ``delete_checkpoint``) the chief
        also deletes every committed checkpoint, so the next run starts fresh.
        Afterwards the writer lock is released (:meth:`open` takes it again)."""
        try:
            self._delete_backup(remove_checkpoints)
        finally:
            if self.engine is not None:
                self.engine.close()

    def open(self) -> None:
        """Take the directory's writer lock again (the chief), e.g. for a second ``fit``."""
        if self.engine is not None:
            self.engine.open()

    def close(self) -> None:
        """Release the writer lock once the write in flight is done (never raises)."""
        if self.engine is not None:
            self.engine.close()

    def _delete_backup(self, remove_checkpoints: bool) -> None:
        self.finish()
        if self.temp_dir is not None and os.path.lexists(self.temp_dir):
            self.fs.rmtree(self.temp_dir)
        if remove_checkpoints and self.topology.primary:
            own = self.engine.store if self.engine is not None else None
            store = own or CheckpointStore.of(self.cfg)
            for name in ("last", "best"):
                if os.path.lexists(self.layout.link(name)):
                    self.fs.unlink(self.layout.link(name))
            for epoch in store.epochs():
                store.delete(epoch)
            self.log.info("delete_backup: removed every checkpoint")

    # -- restoring -------------------------------------------------------------------
    def restore(self, epoch: int | None = None, *, timeout_exits: bool = False) -> dict[str, Any] | None:
        """Load the checkpoint the chief chooses into this worker's model.

        Call it on every worker. Follows ``ckpt_restart_mode`` and
        ``ckpt_restart_epoch`` like ``restart()`` (the chief pulls from
        the persistent tier when its newest checkpoint is newer). With several
        workers this is the protocol of every multi-process job
        (:func:`~candle_ckpt.engine.group_restore.agree_on_checkpoint`) over the
        workers' group (:func:`~candle_ckpt.distributed.tf_group.tf_group`): the
        chief chooses, every worker verifies that checkpoint's files, and if one
        cannot, the chief rejects it and chooses again (an older one), every
        worker with it.

        Args:
            epoch: Restore exactly this epoch (overrides ``ckpt_restart_epoch``).
            timeout_exits: A meeting that times out is a hang, not an error: the process exits with status 124
                after the hang watchdog's report, as ``restart()`` asks (its callers have nothing to catch);
                only where the watchdog is on (``ckpt_hang_timeout``).

        Returns:
            The restored sidecar as a dict (``"epoch"`` = completed epochs), or None.

        Raises:
            NoValidCheckpoint: on every worker, if the chief found none in
                ``required`` mode (or not the exact epoch asked for).
            GroupTimeout: a worker did not reach a meeting point of the restore
                within ``collective_timeout_s`` (naming the point and the missing ranks), unless
                ``timeout_exits``.
        """
        found = self.restore_resumed(epoch, timeout_exits=timeout_exits)
        if self.resumed is not None and self.engine is not None:
            adopt(self.engine, self.resumed)  # no run here: the one adoption, as a run's (engine/run.py)
        return found

    def restore_resumed(self, epoch: int | None = None, *, timeout_exits: bool = False) -> dict[str, Any] | None:
        """:meth:`restore` without adopting what it loaded: for a front end whose run adopts it
        (:attr:`resumed`, by :class:`~candle_ckpt.engine.run.TrainingRun`)."""
        if not self.cfg.restores(epoch):
            return None
        own = self.engine.store if self.engine is not None and self.engine.store.is_open else None
        group = self.group
        if group.size == 1:
            try:  # one worker: the one-process path (a step checkpoint newer than last first, as a restart does)
                resumed = restore(self.cfg, self.log, self.adapter, epoch=epoch, fs=self.fs, store=own)
            finally:
                self._resync()
            return self._loaded(resumed)
        return self._restore_together(group, epoch, own, timeout_exits)

    def _restore_together(
        self, group: Group, epoch: int | None, own: CheckpointStore | None, timeout_exits: bool
    ) -> dict[str, Any] | None:
        """:meth:`restore` of several workers: the one protocol over ``group``'s scope for this restore."""
        scope = scoped(group, "restore")  # this restore's own keys, all deleted by its last meeting
        try:
            try:
                resumed = restore(
                    self.cfg, self.log, self.adapter, group=scope, name=scope.meeting("restore"), epoch=epoch,
                    fs=self.fs, store=own, who=self.info.name, timeout_s=self.timeout_s, node_local=False,
                    timeout_exits=timeout_exits,
                )  # fmt: skip
            finally:
                if self.topology.primary:
                    self._resync()
            found = self._loaded(resumed)
        except GroupTimeout:
            raise  # a worker is gone: no last meeting to hold (the keys go with the job)
        except Exception:
            scope.close(self.timeout_s)  # an error every worker raises (the chief's word): all meet here
            raise
        scope.close(self.timeout_s)
        return found

    def _resync(self) -> None:
        """The chief's next commit continues after a checkpoint a restore pulled from the persistent tier."""
        if self.engine is not None and self.cfg.persistent:
            self.engine.store.resync_generation()

    def _loaded(self, resumed: Resumed | None) -> dict[str, Any] | None:
        """Keep what the driver loaded (None: start from scratch)."""
        self.resumed = resumed
        if resumed is None:
            return None
        self.load = resumed.load
        self.restored_epoch = resumed.sidecar.epoch
        return resumed.sidecar.to_dict()

    def maybe_load_initial_epoch_from_ckpt(self, initial_epoch: int, mode: str = "epoch") -> int:
        """The epoch to start at: the restored checkpoint's (completed epochs) if
        :meth:`restore` loaded one, else ``initial_epoch``."""
        if mode != "epoch":
            raise ValueError(f"mode must be 'epoch' (checkpoints are taken at epoch ends); got {mode!r}")
        return self.restored_epoch if self.restored_epoch is not None else initial_epoch
