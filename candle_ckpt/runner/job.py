"""``JobRunner``: the epoch job runner for custom training loops (caffe2's JobRunner).

For training that is not ``model.fit`` (a ``GradientTape`` loop, a GAN, any
loop calling ``optimizer.apply``). The runner owns the epoch loop::

    resume (newest valid, or an exact epoch)  --or--  init_fn(); save epoch 0
    while no stop condition holds:
        logs = epoch_fn(epoch); save epoch + 1 (policy, keep, async, uploads)
    exit_fn()

and saves through the same :class:`~candle_ckpt.engine.engine.CheckpointEngine` as
the callback, so it has the same crash-safe commit, CRC verification with
fallback, keep policies, async writer, ``ckpt_on_error`` and remote copies.

What a checkpoint holds, and optimizers: :mod:`candle_ckpt.runner.state`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.group import SOLO, Group, is_primary, scoped
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.preempt_control import plain_logs
from candle_ckpt.engine.restore import restore
from candle_ckpt.engine.resume import Chosen, Resumed
from candle_ckpt.engine.run import TrainingRun
from candle_ckpt.multihost.compile_cache import use_compile_cache
from candle_ckpt.multihost.load import kept_parts
from candle_ckpt.multihost.save import keras_group
from candle_ckpt.runner.sharded import capture_runner_sharded, files_for, restore_runner_sharded
from candle_ckpt.runner.sharded import reads as group_reads
from candle_ckpt.runner.state import (  # noqa: F401 - STATE_* are this module's names too
    STATE_FILES,
    STATE_H5,
    STATE_JSON,
    STATE_NPZ,
    RunnerObject,
    capture_runner,
    parse_stop_conditions,
    restore_runner,
    state_kind,
)
from candle_ckpt.storage.sharded import MANIFEST

StopCondition = int | Callable[[int, Mapping[str, Any]], bool]


class JobRunner:
    """Run an epoch loop with checkpoints after init and after every epoch.

    Args:
        gParameters: The job's parameters (``ckpt_*`` keys; ``epochs`` is the
            default epoch limit).
        init_fn: Called once on a fresh start, before epoch 0 is saved; skipped
            when the run resumes.
        epoch_fn: ``epoch_fn(epoch) -> logs`` runs one epoch; ``epoch`` is the
            number of completed epochs (0-based index of the epoch to run).
        exit_fn: Called once after the loop ends normally.
        objects: ``{name: model | layer | optimizer | (optimizer, var_list)}``,
            each saved to ``<name>.weights.h5``.
        state: The user's loop state, a dict the runner saves with every
            checkpoint and restores in place on resume: JSON values, NumPy
            arrays/scalars, ``numpy.random.Generator``, ``keras.Variable`` and
            ``keras.random.SeedGenerator``.
        stop_conditions: Ints (epoch limits) and callables ``(epoch, logs) ->
            bool`` checked after each epoch (and on the restored logs when
            resuming). Default: ``gParameters["epochs"]``.
        resume_from_epoch: Restore exactly this epoch (over ``ckpt_restart_epoch``).
        strategy: A ``tf.distribute`` strategy (``MultiWorkerMirroredStrategy``)
            the objects were built under. Run the same runner on every worker:
            checkpoints go through :class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`
            (the chief commits, every worker restores the chief's choice).
            ``epoch_fn`` must then return the same (all-reduced) logs on every worker.
            A job of several JAX processes (``jax.distributed``, ``jax.process_count() > 1``)
            needs no argument: run the same runner on every process with the same
            ``ckpt_directory``; each writes its shards and its own ``state`` into every
            checkpoint, process 0 commits (:mod:`candle_ckpt.runner.sharded`), and
            ``epoch_fn`` must return the same logs on every process.
        logger: ``"DEFAULT"``, a :class:`logging.Logger`, or None.
        verbose: Print progress (with ``logger="DEFAULT"``).
        fs: The file-system seam every change on disk goes through
            (:class:`~candle_ckpt.core.fs.LocalFS`); None for the real one. Tests pass
            :class:`~candle_ckpt.testing.faultfs.FaultFS` to inject faults.

    Raises:
        ValueError, TypeError: an invalid parameter, object or state value (named).
    """

    def __init__(
        self,
        gParameters: Mapping[str, Any],
        *,
        epoch_fn: Callable[[int], Mapping[str, Any] | None],
        objects: Mapping[str, Any],
        init_fn: Callable[[], None] | None = None,
        exit_fn: Callable[[], None] | None = None,
        state: MutableMapping[str, Any] | None = None,
        stop_conditions: StopCondition | Iterable[StopCondition] | None = None,
        resume_from_epoch: int | None = None,
        strategy: Any = None,
        logger: str | logging.Logger | None = "DEFAULT",
        verbose: bool = True,
        fs=None,
    ) -> None:
        self.params = dict(gParameters)
        self.cfg = CkptConfig.from_params(gParameters)
        use_compile_cache(self.cfg)  # on JAX, a restart reads back what the loop compiled
        if not callable(epoch_fn):
            raise TypeError(f"epoch_fn must be callable; got {type(epoch_fn).__name__}")
        if not isinstance(objects, Mapping) or not objects:
            raise ValueError("objects must be a non-empty dict {name: Keras model/layer/optimizer}")
        self.objects = [RunnerObject(name, value) for name, value in objects.items()]
        self.state = state if state is not None else {}
        self.kinds = {key: state_kind(key, value) for key, value in self.state.items()}
        self.limits, self.conditions = parse_stop_conditions(stop_conditions, self.cfg.epochs)
        if resume_from_epoch is not None and (
            not isinstance(resume_from_epoch, int) or isinstance(resume_from_epoch, bool) or resume_from_epoch < 0
        ):
            raise ValueError(f"resume_from_epoch must be an int >= 0 or None; got {resume_from_epoch!r}")
        self.resume_from_epoch = resume_from_epoch
        self.init_fn, self.epoch_fn, self.exit_fn = init_fn, epoch_fn, exit_fn
        self.log = OpsLog(L.Layout.of(self.cfg).log, get_logger(logger, verbose))
        self.logger, self.verbose = logger, verbose
        self.fs = fs
        self.strategy = strategy
        self.workers = None  # the WorkerTrainingState of a distributed run
        self.group: Group = SOLO  # the processes of a multi-process JAX job (each writes its part of every checkpoint)
        self._agree: Callable[[bool], bool] | None = None  # all processes read their part (a group restore)
        self._meeting = ""  # the group restore's meeting point prefix
        self.engine: CheckpointEngine | None = None
        self.epoch = 0
        self.step = 0  # steps done in the epoch in progress (counted by step_end)
        self.resumed_from: int | None = None
        # Steps already done in epoch resumed_from when a mid-epoch checkpoint was restored:
        # epoch_fn skips that many batches of that epoch. None after an epoch checkpoint.
        self.resumed_step: int | None = None
        self.preempted: tuple[int, int] | None = None  # (epoch, step) of a preemption save
        self.run: TrainingRun | None = None  # train()'s lifecycle (engine/run.py)
        self._restored_at: tuple[int, int] | None = None  # (epoch, step) of a restored mid-epoch checkpoint
        self.load: dict[str, Any] | None = None
        self.resumed: Resumed | None = None  # what _resume loaded, adopted by the run

    def _should_stop(self, epoch: int, logs: Mapping[str, Any] | None) -> bool:
        if any(epoch >= limit for limit in self.limits):
            return True
        return logs is not None and any(bool(cond(epoch, logs)) for cond in self.conditions)

    # -- capture and restore (the Adapter of candle_ckpt.engine.resume) --------------------
    @property
    def reads(self) -> list[str]:
        """The files of a checkpoint that :meth:`restore` reads (each object's file, the loop state): verified first."""
        rank = self.group.rank
        return [f for o in self.objects for f in (o.file, o.extra_file)] + list(STATE_FILES) + list(group_reads(rank))

    def capture(self, cfg: CkptConfig) -> Capture:
        """This process's state at the end of the current epoch (objects, RNG states, loop position), to save."""
        return self._capture(self.epoch)

    def _capture(self, epoch: int, step: int | None = None) -> Capture:
        if self.group.size > 1:  # this process's part: its shards and its own loop state
            copy = self.cfg.async_save and step is None  # a step checkpoint is written at once
            return capture_runner_sharded(self.objects, self.state, self.kinds, epoch, step, self.group, copy)
        return capture_runner(self.objects, self.state, self.kinds, epoch, step)

    def restore(self, chosen: Chosen, log: OpsLog, where: str) -> None:
        """Load the verified checkpoint ``chosen`` into the objects and the loop state (all or nothing)."""
        if chosen.sidecar.model_file == MANIFEST:  # written by several processes (read here by any number)
            self._restored_at = restore_runner_sharded(
                self.objects, self.state, self.kinds, chosen, log, where, self.group, self._agree
            )
            return
        if self.group.size == 1:
            self._restored_at = restore_runner(self.objects, self.state, chosen, log, where)
            return
        # A one-process checkpoint under several processes: every process loads the same files (mapped
        # by the group's verification: read here as bytes), then they meet.
        contents = {name: bytes(data) for name, data in chosen.contents.items()}
        if not is_primary(self.group):
            log.warning(
                f"restart: {where} was written by one process: process {self.group.rank} continues with "
                "that process's loop state (its RNG states and positions)"
            )
        self._restored_at = restore_runner(self.objects, self.state, chosen._replace(contents=contents), log, where)
        self.group.barrier(f"{self._meeting}/loaded", group_timeout())

    # -- the loop -----------------------------------------------------------------
    def _resume(self) -> Mapping[str, Any] | None:
        """The restore driver over this job's processes (or its workers'); what it resumed is kept for the run."""
        if self.workers is not None:
            found = self.workers.restore_resumed(epoch=self.resume_from_epoch)  # the run adopts it
            self.load, self.resumed = self.workers.load, self.workers.resumed
            return self._resumed_at(found["epoch"], found.get("logs")) if found else None
        if not self.cfg.restores(self.resume_from_epoch):
            return None
        group = self.group
        if group.size > 1:  # every process restores the checkpoint the primary chose, verified everywhere
            self._meeting = name = group.meeting("restore")
            self._agree = lambda ok: group.all_agree(f"{name}/read", ok, group_timeout())
            needed = files_for(self.objects, self.state, self.kinds, group.rank)
            keep = lambda names: kept_parts(names, group.rank)  # noqa: E731
            resumed = restore(
                self.cfg, self.log, self, group=group, name=name, epoch=self.resume_from_epoch, mapped=True,
                who=f"process {group.rank}", needed=needed, keep=keep, timeout_exits=True,
            )  # fmt: skip
        else:  # a step checkpoint (a preemption save) newer than last is preferred: the epoch continues there
            resumed = restore(self.cfg, self.log, self, epoch=self.resume_from_epoch, fs=self.fs)
        if resumed is None:
            return None
        self.load, self.resumed = resumed.load, resumed
        return self._resumed_at(resumed.sidecar.epoch, resumed.sidecar.logs)

    def _resumed_at(self, epoch: int, logs: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        at = self._restored_at
        if at is not None:  # a mid-epoch checkpoint: epoch ``at[0]`` is resumed after ``at[1]`` steps
            self.epoch = self.resumed_from = at[0]
            self.step = self.resumed_step = at[1]
            return None  # a part of an epoch has no logs for the stop conditions
        self.epoch = self.resumed_from = epoch
        return logs or None  # epoch 0 (after init) has no logs for the stop conditions

    def step_end(self, logs: Mapping[str, Any] | None = None) -> bool:
        """Count one training step; call it on every worker after every step of ``epoch_fn``.

        Returns True when training must stop: a preemption signal (``ckpt_preempt_signals``)
        reached this worker or, under a multi-worker strategy, any worker. By then
        every worker has saved this step (the chief commits it) and ``epoch_fn``
        should return at once; the runner then ends without an epoch checkpoint
        and without ``exit_fn``. With ``ckpt_preempt_exit_code`` set, the process
        exits with that code here instead of returning.

        Args:
            logs: The epoch's metrics so far, recorded with a preemption save.
        """
        self.step += 1
        if self.run is None:
            return False
        epoch, step = self.epoch, self.step
        try:
            return self.run.step_end(epoch, step, plain_logs(logs), lambda copy=False: self._capture(epoch, step))
        finally:  # set before an exit with ckpt_preempt_exit_code too
            self.preempted = self.run.saved_at

    def train(self) -> dict[str, Any]:
        """Resume or initialise, run epochs until a stop condition holds, then ``exit_fn``.

        Returns:
            The logs of the last epoch run (or of the checkpoint resumed from).

        Raises:
            CheckpointSaveError, CheckpointUploadError: a save/upload failed
                with ``ckpt_on_error=raise``; earlier checkpoints are intact.
            NoValidCheckpoint: an exact epoch, or ``required`` mode, and no valid checkpoint.
        """
        self.group = scoped(keras_group(), "train") if self.strategy is None else SOLO  # this train()'s own keys
        self.cfg = self.cfg.resolved()  # ckpt_async=auto: asynchronous
        if self.group.size > 1:  # several JAX processes: each writes its part; process 0 locks, commits and logs
            layout = L.Layout.of(self.cfg)
            self.log = OpsLog(layout.log if is_primary(self.group) else None, get_logger(self.logger, self.verbose))
        if self.strategy is not None:
            from candle_ckpt.distributed.worker_state import WorkerTrainingState

            self.workers = WorkerTrainingState(
                self.params, strategy=self.strategy, adapter=self, logger=self.logger, verbose=self.verbose, fs=self.fs
            )
            self.log, self.engine = self.workers.log, self.workers.engine  # a non-chief logs to the logger only
            self.cfg = self.workers.cfg  # ckpt_async=auto decided as the workers decided it
            logs = self._resume()  # every worker loads the chief's choice
        else:
            logs = self._resume()
            self.engine = CheckpointEngine(self.cfg, self.log, fs=self.fs, group=self.group)
        self.run = run = self._training_run()
        done = False
        try:
            # The run adopts what was resumed: best tracking continues from it, and it is protected from pruning.
            run.begin(resumed=self.resumed)
            if self.resumed_from is None:
                logs = self._fresh_start()
            elif not self._finished(logs):
                logs = self._run_epochs(None if self._explicit else logs, asked=True)
            done = True
        finally:
            run.end(ok=done)  # the last write lands (its error raised if the loop ended well), the lock is let go
            if done and self.workers is not None:
                self.workers.delete_backup()  # a non-chief's scratch directory
        if self.exit_fn is not None and self.preempted is None:
            self.exit_fn()
        return dict(logs or {})

    def _fresh_start(self) -> Mapping[str, Any] | None:
        """No checkpoint: ``init_fn``, epoch 0 saved, then the epochs."""
        if self.init_fn is not None:
            self.init_fn()
        for o in self.objects:  # a usage error, not a save failure for ckpt_on_error=warn to hide
            o.ensure_built()
        self.epoch = 0
        self.engine.save(0, {}, lambda: self._capture(0), reason="init")
        return self._run_epochs(None)

    @property
    def _explicit(self) -> bool:
        """The epoch to resume was asked for (``resume_from_epoch``, ``ckpt_restart_epoch``): it trains on."""
        return self.resume_from_epoch is not None or self.cfg.restart_epoch is not None

    def _finished(self, logs: Mapping[str, Any] | None) -> bool:
        """A resumed run that is finished (the run's rule, engine/finished.py): said in one line; the loop then runs
        no epoch.

        A stop condition that holds on the restored logs ended the run, unless the epoch was asked
        for explicitly (``resume_from_epoch``, ``ckpt_restart_epoch``): that request trains on.
        """
        side = self.resumed.sidecar if self.resumed is not None else None
        if side is None or self.resumed_step is not None:
            return False  # nothing restored, or a mid-epoch checkpoint: its epoch is not over
        held = not self._explicit and logs is not None and any(bool(cond(self.epoch, logs)) for cond in self.conditions)
        ended = ("a stop condition", self.epoch) if held else None
        limit = min((n for n in self.limits if self.epoch >= n), default=None)
        return self.run.finished(ended, limit, call="train()", limit=f"the runner's epoch limit is {limit}")

    def _run_epochs(self, logs: Mapping[str, Any] | None, asked: bool = False) -> Mapping[str, Any] | None:
        """Run epochs until a stop condition holds (``asked``: they were asked before the first, and held not)."""
        while asked or not self._should_stop(self.epoch, logs):
            asked = False
            epoch = self.epoch
            if epoch != self.resumed_from:
                self.step = 0
            logs = dict(self.epoch_fn(epoch) or {})
            if self.run.stopped:  # preempted in mid-epoch: that step's checkpoint is the newest
                break
            self.epoch = done = epoch + 1
            # A request at an epoch's end (or from a loop that never calls step_end), unless the job is done.
            last = self._should_stop(done, logs)
            if self.run.epoch_end(done, logs, lambda: self._capture(done), last_epoch=last):  # noqa: B023 - at once
                self.preempted = self.run.saved_at
                break
        return logs

    def _training_run(self) -> TrainingRun:
        """train()'s lifecycle: over the JAX processes' group (its scope is the one the restore met in, closed at
        the end), or the tf.distribute workers' group (a scope of its own)."""
        if self.workers is None:
            return TrainingRun(self.cfg, self.engine, self.log, group=self.group, scope=None)
        return TrainingRun(self.cfg, self.engine, self.log, group=self.workers.group, who=self.workers.info.name)

    def stats(self) -> dict[str, Any]:
        """Durations and MB/s of every save, of the restore and of every upload, and errors."""
        if self.engine is None:
            return {"saves": [], "load": self.load, "uploads": [], "errors": []}
        return self.engine.stats()
