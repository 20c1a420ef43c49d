"""``WorkerTrainingState``: checkpoint/restart under ``tf.distribute`` (imports tensorflow lazily).

Follows Keras 2's ``keras/distribute/worker_training_state.py``, on top of the crash-safe store:

* **Every worker takes part in every save**, at the same epoch (reading a distributed
  variable may be a collective); the save decision comes from the same all-reduced logs
  on every worker, so they agree without talking.
* **Only the chief writes to ``ckpt_directory``**: it commits, prunes and appends to
  ``ckpt.log``. Every other worker writes the same files into
  ``ckpts/.tmp-worker-<task_id>/`` and removes it at once (``.tmp-*`` is debris to a restart).
* **Every worker restores the checkpoint the chief chose.** The chief picks and sends
  ``(kind, epoch, generation)`` with one small all-reduce; each worker verifies that exact
  checkpoint's CRCs, a second all-reduce makes sure all succeeded, and only then does any
  worker load it. Workers choosing on their own could load different epochs and diverge.

``ckpt_directory`` must be on a file system every worker can read (as for Keras's
``BackupAndRestore``). The two restore collectives carry a timeout (``collective_timeout_s``);
training collectives are bounded by the strategy's ``CommunicationOptions`` and TensorFlow's
coordination service.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import CheckpointError, NoValidCheckpoint
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.distributed.cluster import WorkerInfo, multi_worker_strategy, sum_over_workers, worker_info
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.pending import Pending
from candle_ckpt.engine.resume import Chosen, Resumed, load_chosen, select_checkpoint, verify_exact
from candle_ckpt.storage.store import CheckpointStore

__all__ = ["WorkerInfo", "WorkerTrainingState", "multi_worker_strategy", "worker_info"]

DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
# The chief's choice at restore, as broadcast: start from scratch, an epoch checkpoint, an error, a step checkpoint.
_SCRATCH, _EPOCH, _FAILED, _STEP = 0, 1, 2, 3


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
        collective_timeout_s: Bound on each restore collective; a worker that
            waits longer raises instead of hanging.

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
        collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
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
        number = isinstance(collective_timeout_s, (int, float)) and not isinstance(collective_timeout_s, bool)
        if not (number and collective_timeout_s > 0):
            raise ValueError(f"collective_timeout_s must be a number > 0 (seconds); got {collective_timeout_s!r}")
        self.timeout_s = float(collective_timeout_s)
        self.cfg = self.cfg.resolved(self.info.num_workers)  # ckpt_async=auto: async with several workers
        self.layout = Layout.of(self.cfg)
        self.log = OpsLog(self.layout.log if self.info.is_chief else None, get_logger(logger, verbose))
        self.fs = fs or LocalFS()
        # Non-chief scratch space: a ".tmp-*" name is debris to the store and never read by a restart.
        scratch = os.path.join(self.layout.ckpts, f".tmp-worker-{self.info.task_id}")
        self.temp_dir = None if self.info.is_chief else scratch
        self.restored_epoch: int | None = None
        # What restore() loaded; restart() attaches it to the model for the callback.
        self.resumed: Resumed | None = None
        self.load: dict[str, Any] | None = None
        self.engine: CheckpointEngine | None = None
        if writable:
            # The chief opens the store now: it locks the directory and removes
            # debris before any worker starts writing its temporary directory.
            self.engine = CheckpointEngine(self.cfg, self.log, fs=self.fs, scratch_dir=self.temp_dir)

    @property
    def is_chief(self) -> bool:
        return self.info.is_chief

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
        if remove_checkpoints and self.info.is_chief:
            own = self.engine.store if self.engine is not None else None
            store = own or CheckpointStore.of(self.cfg)
            for name in ("last", "best"):
                if os.path.lexists(self.layout.link(name)):
                    self.fs.unlink(self.layout.link(name))
            for epoch in store.epochs():
                store.delete(epoch)
            self.log.info("delete_backup: removed every checkpoint")

    # -- restoring -------------------------------------------------------------------
    def restore(self, epoch: int | None = None) -> dict[str, Any] | None:
        """Load the checkpoint the chief chooses into this worker's model.

        Call it on every worker. Follows ``ckpt_restart_mode`` and
        ``ckpt_restart_epoch`` like ``restart()`` (the chief pulls from
        ``ckpt_upload_url`` when its directory is empty).

        Args:
            epoch: Restore exactly this epoch (overrides ``ckpt_restart_epoch``).

        Returns:
            The restored sidecar as a dict (``"epoch"`` = completed epochs), or None.

        Raises:
            NoValidCheckpoint: on every worker, if the chief found none in
                ``required`` mode, or any worker could not verify the chosen one.
            CheckpointError: a restore collective timed out.
        """
        cfg = self.cfg
        if not cfg.restores(epoch):
            return None
        reads = tuple(self.adapter.reads)
        multi = self.info.num_workers > 1
        start = time.perf_counter()
        chosen, error = self._choose(epoch, reads) if self.info.is_chief else (None, None)
        code, chosen_epoch, generation = self._agree_on_choice(chosen, error, multi)
        if code == _SCRATCH:
            self.resumed = None
            return None
        chosen = self._verified(chosen, code, chosen_epoch, generation, reads, multi)
        who = f"worker {self.info.task_type}:{self.info.task_id}" if multi else ""
        self.load = load_chosen(cfg, self.log, self.adapter, chosen, time.perf_counter() - start, who)
        pending = getattr(self.adapter, "pending", None) or Pending()  # state the adapter applies later
        side = chosen.sidecar
        self.resumed = Resumed(os.path.realpath(cfg.directory), side, self.load, pending)
        if self.engine is not None:
            self.engine.adopt_resumed(side, self.load)
        self.restored_epoch = side.epoch
        return side.to_dict()

    def _choose(self, epoch: int | None, reads: tuple[str, ...]) -> tuple[Chosen | None, Exception | None]:
        """The chief's choice (a step checkpoint newer than last first), or the error to tell the others."""
        cfg, chosen, error = self.cfg, None, None
        try:
            own = self.engine.store if self.engine is not None and self.engine.store.is_open else None
            # A step checkpoint (a preemption save) newer than last is preferred: training continues mid-epoch.
            chosen = select_checkpoint(cfg, self.log, reads=reads, epoch=epoch, fs=self.fs, store=own, steps=True)
        except Exception as err:  # told to the others before raising, so none waits forever
            error = err
        if self.engine is not None and cfg.persistent:
            self.engine.store.resync_generation()  # a pull from the persistent tier may have committed here
        return chosen, error

    def _agree_on_choice(self, chosen: Chosen | None, error: Exception | None, multi: bool) -> tuple[int, int, int]:
        """Broadcast the chief's choice as (code, epoch, generation); raise on every worker if it failed."""
        code, chosen_epoch, generation = _SCRATCH, 0, 0
        if error is not None:
            code = _FAILED
        elif chosen is not None:
            code = _STEP if chosen.sidecar.step is not None else _EPOCH
            chosen_epoch, generation = chosen.epoch, chosen.sidecar.generation
        if multi:
            chiefs, code, chosen_epoch, generation = sum_over_workers(
                self.strategy,
                self.timeout_s,
                [1, code, chosen_epoch, generation] if self.info.is_chief else [0, 0, 0, 0],
                "choose",
            )
            if chiefs != 1:
                raise CheckpointError(f"expected exactly one chief in the cluster, found {chiefs}")
        if code == _FAILED:
            if error is not None:
                raise error
            raise NoValidCheckpoint(
                f"the chief could not choose a checkpoint to restore in {self.layout.root} (ckpt_restart_mode="
                f"{self.cfg.restart_mode}); see the chief's log for why"
            )
        return code, chosen_epoch, generation

    def _verified(
        self, chosen: Chosen | None, code: int, chosen_epoch: int, generation: int, reads: tuple[str, ...], multi: bool
    ) -> Chosen:
        """The chosen checkpoint, verified on this worker (the chief has it already); all workers or none."""
        cfg = self.cfg
        where = self.layout.step_dir(generation) if code == _STEP else self.layout.epoch_dir(chosen_epoch)
        failure: CheckpointError | None = None
        if chosen is None:
            try:
                store = CheckpointStore.of(cfg)
                if code == _STEP:  # the step checkpoint of that generation (its sidecar says so)
                    chosen = Chosen(chosen_epoch, *store.steps.verify(generation, reads=reads))
                else:
                    chosen = verify_exact(store, chosen_epoch, generation, reads)
            except CheckpointError as err:
                failure = err
        if multi:
            (failed,) = sum_over_workers(self.strategy, self.timeout_s, [1 if failure else 0], "verify")
            if failed:
                detail = f": {failure}" if failure else " (see that worker's log)"
                raise NoValidCheckpoint(
                    f"{failed} worker(s) could not verify {where} chosen by the chief{detail}; "
                    "nothing was loaded on any worker"
                )
        return chosen

    def maybe_load_initial_epoch_from_ckpt(self, initial_epoch: int, mode: str = "epoch") -> int:
        """The epoch to start at: the restored checkpoint's (completed epochs) if
        :meth:`restore` loaded one, else ``initial_epoch``."""
        if mode != "epoch":
            raise ValueError(f"mode must be 'epoch' (checkpoints are taken at epoch ends); got {mode!r}")
        return self.restored_epoch if self.restored_epoch is not None else initial_epoch
