"""``WorkerTrainingState``: checkpoint/restart under ``tf.distribute`` (imports tensorflow lazily).

Follows Keras 2's ``keras/distribute/worker_training_state.py``, on top of the
crash-safe store:

* **Every worker takes part in every save.** Reading a distributed variable
  may be a collective operation, so every worker takes the host snapshot at
  the same epoch; the save decision (policy, best metric) is computed from
  the same all-reduced logs on every worker, so they agree without talking.
* **Only the chief writes to ``ckpt_directory``**: it commits (``work/`` ->
  ``epochs/NNN`` -> links), prunes and appends to ``ckpt.log``. Every other
  worker writes the same files into ``ckpts/.tmp-worker-<task_id>/`` and
  removes it at once. Such a directory left by a killed worker is never read
  by a restart and is removed by the chief's next writer (``.tmp-*`` is debris).
* **Every worker restores the checkpoint the chief chose.** The chief picks
  (newest valid, or ``ckpt_restart_epoch``) and sends ``(epoch, generation)``
  to all workers with one small all-reduce; each worker then verifies that
  exact checkpoint's CRCs in the chief's directory, a second all-reduce makes
  sure all succeeded, and only then does any worker load it. If workers picked
  their own newest-valid checkpoint, a worker that saw a different directory
  state would load another epoch and the cluster would silently diverge.

``ckpt_directory`` must therefore be on a file system every worker can read
(as for Keras's ``BackupAndRestore``). Collectives hang when a peer has died;
the two restore collectives carry a timeout (``collective_timeout_s``), and
the training collectives are bounded by the strategy's own
``CommunicationOptions(timeout_seconds=...)`` (and TensorFlow's coordination
service, which stops the survivors when a peer's heartbeat is lost).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import CheckpointError, NoValidCheckpoint
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.resume import Chosen, Resumed, load_chosen, select_checkpoint, verify_exact
from candle_ckpt.storage.store import CheckpointStore

DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WorkerInfo:
    """Where this process sits in the cluster."""

    task_type: str | None
    task_id: int
    num_workers: int
    is_chief: bool


def _cluster_from_tf_config() -> tuple[dict[str, Any], str | None, int]:
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return {}, None, 0
    try:
        conf = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"TF_CONFIG is not valid JSON: {err}") from None
    if not isinstance(conf, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object; got {type(conf).__name__}")
    task = conf.get("task") or {}
    return dict(conf.get("cluster") or {}), task.get("type"), int(task.get("index", 0) or 0)


def worker_info(strategy: Any = None) -> WorkerInfo:
    """Return this worker's role, from ``strategy.cluster_resolver`` or ``TF_CONFIG``.

    The chief is the task of type ``"chief"``, or worker 0 when the cluster
    has no chief (as ``multi_worker_util.is_chief`` decides). A process
    outside any cluster is the chief of a one-worker cluster.

    Raises:
        ValueError: ``TF_CONFIG`` is malformed, or the cluster has parameter
            servers (``ParameterServerStrategy`` is not supported).
    """
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    if resolver is not None and getattr(resolver, "task_type", None) is not None:
        spec = resolver.cluster_spec().as_dict()
        task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    else:
        spec, task_type, task_id = _cluster_from_tf_config()
    if spec.get("ps"):
        raise ValueError(
            "the cluster has parameter servers ('ps' tasks): ParameterServerStrategy is not supported; "
            "use MultiWorkerMirroredStrategy"
        )
    num_workers = len(spec.get("chief") or []) + len(spec.get("worker") or [])
    if task_type is None or num_workers <= 1:
        return WorkerInfo(task_type, task_id, max(num_workers, 1), task_type in (None, "chief", "worker"))
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not spec.get("chief"))
    return WorkerInfo(task_type, task_id, num_workers, is_chief)


def multi_worker_strategy(model: Any) -> Any:
    """The model's ``tf.distribute`` strategy if it spans several workers, else None."""
    strategy = getattr(model, "_distribute_strategy", None) or getattr(model, "distribute_strategy", None)
    if strategy is None or type(strategy).__module__.split(".")[0] != "tensorflow":
        return None
    return strategy if worker_info(strategy).num_workers > 1 else None


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
            ``keep_files``, ``capture(cfg) -> Capture`` and
            ``restore(chosen, ops, where)`` (the epoch runner is one).
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
        if isinstance(collective_timeout_s, bool) or not (
            isinstance(collective_timeout_s, (int, float)) and collective_timeout_s > 0
        ):
            raise ValueError(f"collective_timeout_s must be a number > 0 (seconds); got {collective_timeout_s!r}")
        self.timeout_s = float(collective_timeout_s)
        self.layout = Layout.at(self.cfg.directory, flat=self.cfg.layout == "flat")
        self.ops = OpsLog(self.layout.log if self.info.is_chief else None, get_logger(logger, verbose))
        self.fs = fs or LocalFS()
        # Non-chief scratch space: a ".tmp-*" name is debris to the store and never read by a restart.
        scratch = os.path.join(self.layout.ckpts, f".tmp-worker-{self.info.task_id}")
        self.temp_dir = None if self.info.is_chief else scratch
        self.restored_epoch: int | None = None
        self.restored_step: int | None = None  # steps done in epoch restored_epoch + 1 (a step checkpoint)
        # What restore() loaded; restart() attaches it to the model for the callback.
        self.resumed: Resumed | None = None
        self.load: dict[str, Any] | None = None
        self.engine: CheckpointEngine | None = None
        if writable:
            # The chief opens the store now: it locks the directory and removes
            # debris before any worker starts writing its temporary directory.
            self.engine = CheckpointEngine(self.cfg, self.ops, fs=self.fs, scratch_dir=self.temp_dir)

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
            store = (
                self.engine.store
                if self.engine is not None
                else CheckpointStore(self.cfg.directory, flat=self.cfg.layout == "flat")
            )
            for name in ("last", "best"):
                if os.path.lexists(self.layout.link(name)):
                    self.fs.unlink(self.layout.link(name))
            for epoch in store.epochs():
                store.delete(epoch)
            self.ops.info("delete_backup: removed every checkpoint")

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
        if cfg.restart_mode == "off" and epoch is None:
            return None
        keep = tuple(self.adapter.keep_files)
        multi = self.info.num_workers > 1
        start = time.perf_counter()
        chosen: Chosen | None = None
        error: Exception | None = None
        if self.info.is_chief:
            try:
                own = self.engine.store if self.engine is not None and self.engine.store.is_open else None
                # A step checkpoint (a preemption save) newer than last is preferred: training continues mid-epoch.
                chosen = select_checkpoint(cfg, self.ops, keep=keep, epoch=epoch, fs=self.fs, store=own, steps=True)
            except Exception as err:  # told to the others before raising, so none waits forever
                error = err
            if self.engine is not None and cfg.upload_url:
                self.engine.store.resync_generation()  # a pull from the remote copy may have committed here
        # 0: start from scratch, 1: (epoch, generation), 2: error, 3: step checkpoint (epoch, generation)
        code, chosen_epoch, generation = 0, 0, 0
        if error is not None:
            code = 2
        elif chosen is not None:
            code = 3 if chosen.sidecar.step is not None else 1
            chosen_epoch, generation = chosen.epoch, chosen.sidecar.generation
        if multi:
            chiefs, code, chosen_epoch, generation = self._sum_over_workers(
                [1, code, chosen_epoch, generation] if self.info.is_chief else [0, 0, 0, 0], "choose"
            )
            if chiefs != 1:
                raise CheckpointError(f"expected exactly one chief in the cluster, found {chiefs}")
        if code == 2:
            if error is not None:
                raise error
            raise NoValidCheckpoint(
                f"the chief could not choose a checkpoint to restore in {self.layout.root} (ckpt_restart_mode="
                f"{cfg.restart_mode}); see the chief's log for why"
            )
        if code == 0:
            self.resumed = None
            return None
        where = self.layout.step_dir(generation) if code == 3 else self.layout.epoch_dir(chosen_epoch)
        failure: CheckpointError | None = None
        if chosen is None:
            try:
                store = CheckpointStore(cfg.directory, checksum=cfg.checksum, flat=cfg.layout == "flat")
                if code == 3:  # the step checkpoint of that generation (its sidecar says so)
                    chosen = Chosen(chosen_epoch, *store.steps.verify(generation, keep=keep))
                else:
                    chosen = verify_exact(store, chosen_epoch, generation, keep)
            except CheckpointError as err:
                failure = err
        if multi:
            (failed,) = self._sum_over_workers([1 if failure else 0], "verify")
            if failed:
                detail = f": {failure}" if failure else " (see that worker's log)"
                raise NoValidCheckpoint(
                    f"{failed} worker(s) could not verify {where} chosen by the chief{detail}; "
                    "nothing was loaded on any worker"
                )
        who = f"worker {self.info.task_type}:{self.info.task_id}" if multi else ""
        self.load = load_chosen(cfg, self.ops, self.adapter, chosen, time.perf_counter() - start, who)
        pending = dict(getattr(self.adapter, "pending", None) or {})  # state the adapter applies later
        side = chosen.sidecar
        self.resumed = Resumed(os.path.realpath(cfg.directory), side, self.load, pending)
        if self.engine is not None:
            self.engine.adopt_resumed(side, self.load)
        self.restored_epoch, self.restored_step = side.epoch, side.step
        return side.to_dict()

    def maybe_load_initial_epoch_from_ckpt(self, initial_epoch: int, mode: str = "epoch") -> int:
        """The epoch to start at: the restored checkpoint's (completed epochs) if
        :meth:`restore` loaded one, else ``initial_epoch``."""
        if mode != "epoch":
            raise ValueError(f"mode must be 'epoch' (checkpoints are taken at epoch ends); got {mode!r}")
        return self.restored_epoch if self.restored_epoch is not None else initial_epoch

    def _sum_over_workers(self, values: list[int], what: str) -> list[int]:
        """All-reduce (sum) small integers, counting each worker once."""
        import tensorflow as tf

        strategy = self.strategy
        calls = [0]

        def local(ctx) -> Any:
            # Called once per local replica: only the first carries this worker's values.
            first = calls[0] == 0
            calls[0] += 1
            return tf.constant(values if first else [0] * len(values), dtype=tf.int64)

        per_replica = strategy.experimental_distribute_values_from_function(local)
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=self.timeout_s)
        try:
            total = strategy.extended.reduce_to(
                tf.distribute.ReduceOp.SUM, per_replica, destinations=per_replica, options=options
            )
        except tf.errors.DeadlineExceededError as err:
            raise CheckpointError(
                f"restore ({what}): the other workers did not answer within {self.timeout_s:.0f} s "
                f"(a worker died or is not running restore()): {err.message}"
            ) from None
        result = strategy.experimental_local_results(total)[0]
        return [int(v) for v in result.numpy().tolist()]
