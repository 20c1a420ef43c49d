"""``CandleCheckpointCallback``: CANDLE's checkpoint callback for ``model.fit``.

It holds no file logic: each epoch end becomes one call to the shared
:class:`~candle_ckpt.engine.engine.CheckpointEngine`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import keras

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.group import is_primary
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import LineTracker, OpsLog, get_logger, track_stdout, untrack_stdout
from candle_ckpt.distributed.cluster import is_tf_keras
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.epoch_shape import EpochShape
from candle_ckpt.engine.run import TrainingRun
from candle_ckpt.keras import fit_hooks, fit_internals, internals
from candle_ckpt.keras.adapter import capture_model
from candle_ckpt.keras.mid_epoch import resume_mid_epoch
from candle_ckpt.keras.pipeline_state import Pipeline
from candle_ckpt.keras.preflight import apply_optimizer_state, build_optimizer
from candle_ckpt.keras.state import ModelState
from candle_ckpt.keras.train_state import TRAIN_STATE_FILE, TrainState, unpack
from candle_ckpt.multihost.compile_cache import use_compile_cache
from candle_ckpt.multihost.save import SpareChunks, capture_sharded, keras_group
from candle_ckpt.storage.store import FileSpec


class CandleCheckpointCallback(keras.callbacks.Callback):
    """Checkpoint every epoch that the ``ckpt_*`` parameters say to keep.

    Args:
        gParameters: The job's parameter dict (``ckpt_*`` keys and ``epochs``).
        logger: ``"DEFAULT"`` (the ``candle_ckpt`` logger), a
            :class:`logging.Logger`, or None for ``ckpt.log`` only.
        verbose: Print progress to the console (with ``logger="DEFAULT"``).
        fs: The file-system seam every change on disk goes through
            (:class:`~candle_ckpt.core.fs.LocalFS`); None for the real one. Tests pass
            :class:`~candle_ckpt.testing.faultfs.FaultFS` to inject faults.

    Raises:
        ValueError, TypeError: a parameter is invalid (the message names it).
        OSError: ``ckpt_directory`` cannot be created or written.
        DirectoryLocked: another live process writes to the same directory.

    With ``ckpt_async``, ``on_epoch_end`` waits for the previous write (if it
    is still running), takes a host snapshot and returns; one background
    thread commits it. ``on_train_end`` joins that thread and raises its
    error (``ckpt_on_error=raise``). During ``fit``, if SIGTERM has its
    default action, it is turned into ``SystemExit`` so that the exit hook
    commits the last snapshot (waiting at most ``ckpt_async_timeout``).

    The directory's writer lock is held only while ``fit`` runs: creating the
    callback checks the directory (and that no other writer holds it) and
    lets go; ``on_train_begin`` takes the lock, ``on_train_end`` releases it
    after the last write, and a ``fit`` that raises releases it too (a watchdog
    notices that ``fit`` has ended). So ``candle-ckpt rollback`` / ``prune`` work
    in the same process once ``fit`` has returned.

    Exact resume, whatever the order of the calls: ``restart()`` may run
    before or after ``compile()`` and before or after this callback is
    created; what it restored reaches the callback through the model. The
    checkpoint of epoch N is taken after every callback's ``on_epoch_end``
    for epoch N, wherever this callback sits in the list, and holds the other
    callbacks' state, the global RNG states and the input's position
    (``train.state.npz``, see :mod:`candle_ckpt.keras.train_state`).
    """

    def __init__(
        self,
        gParameters: Mapping[str, Any],
        logger: str | logging.Logger | None = "DEFAULT",
        verbose: bool = True,
        *,
        fs: LocalFS | None = None,
    ) -> None:
        super().__init__()
        self.cfg = CkptConfig.from_params(gParameters, require_epochs=True)
        # Several JAX processes: each writes its part of every checkpoint; process 0 locks, commits and logs.
        self.group = keras_group()  # SOLO in one process
        self.cfg = self.cfg.resolved()  # ckpt_async=auto: asynchronous
        use_compile_cache(self.cfg)  # before fit compiles: a restart reads its steps back (JAX only)
        primary = is_primary(self.group)
        self.log = OpsLog(Layout.of(self.cfg).log if primary else None, get_logger(logger, verbose))
        internals.warm_skipsets()  # the save plan then creates no Keras variable (a collective under a distribution)
        # Opening checks the directory now (writable, not held by another writer), not at epoch 50.
        self.engine = CheckpointEngine(self.cfg, self.log, fs=fs, group=self.group)
        self.engine.close()  # held again from on_train_begin to on_train_end
        # The lifecycle of each fit: the lock, the group's scope, the preemption controller, every signal handler,
        # the fit guard, resume adoption and the parked state (engine/run.py). This class feeds it steps and epochs.
        self.run = TrainingRun(
            self.cfg,
            self.engine,
            self.log,
            group=self.group,
            step_saves=True,
            port=fit_internals,  # the callback list, the epoch order, the first epoch (engine/fit_port.py)
            on_release=self._untrack,
            where=fit_internals.waiting_for_input,
        )
        self.run.held.on = self.group.size == 1  # fit's validation batches answer a request (capture.HeldStep)
        self._state: ModelState | None = None
        self._spare = SpareChunks()  # an async multi-process save's buffers, reused once written
        self._stdout: LineTracker | None = None
        self._train: TrainState | None = None
        self._restore: bytes | None = None  # train state waiting for the first epoch of a resumed fit
        self._hooked = False  # saves run after every callback's on_epoch_end (see fit_hooks)
        self._logs: dict[str, Any] = {}
        self._epochs_run = 0
        self._finished = False  # this fit is a finished run's rerun: it trains nothing (engine/finished.py)
        self._epoch = 0  # Keras's index of the epoch running now
        self._sync_cfg = self.cfg.replace(async_save=False)  # a step checkpoint is written at once, uncopied
        self._iterator: Any = None  # the fit's epoch iterator (a mid-epoch resume skips steps in it)
        if not self.run.enabled:
            # Nothing to do per batch: Keras's default hook lets fit dispatch batch hooks asynchronously and
            # skip converting each step's logs (a callback with its own batch hook turns both off).
            self.on_train_batch_end = keras.callbacks.Callback.on_train_batch_end.__get__(self)
            self.on_test_batch_end = keras.callbacks.Callback.on_test_batch_end.__get__(self)

    def set_model(self, model) -> None:
        if is_tf_keras(model):
            raise TypeError(
                "this is the Keras 3 CandleCheckpointCallback but the model is a tf_keras (Keras 2) model; use "
                "candle_ckpt.tf_keras.adapter.CandleCheckpointCallback (or set TF_USE_LEGACY_KERAS=1 before importing)"
            )
        super().set_model(model)

    def on_train_begin(self, logs=None) -> None:
        # The fit's CallbackList, held only in this call: its death tells the run's fit guard that fit ended.
        # The guard, the writer lock, the group's scope, the signals; what restart() attached to the model, adopted
        # (best tracking, resumed_from, no prune of it).
        callback_list = self.run.begin(self, model=self.model)
        self._stdout = track_stdout()  # log records never continue the progress bar's line
        restore = self.run.take_parked(lambda parked, at: apply_optimizer_state(self.model, parked.values, at))
        self._state = ModelState(self.model)
        self._epochs_run = 0
        self._hook_fit(callback_list)
        self._restore = restore
        epochs = (self.params or {}).get("epochs")
        epochs = epochs if isinstance(epochs, int) else self.cfg.epochs
        done = unpack(restore)[0].get("finished") if restore is not None else None  # what EarlyStopping recorded
        self._finished = self.run.finished((done["by"], done["epoch"]) if done else None, epochs, model=self.model)
        if restore is not None and self._hooked and self._finished:
            # No epoch runs: the callbacks get their state back before their on_train_end, as in the
            # uninterrupted run's (EarlyStopping's restore_best_weights).
            fit_hooks.before_train_end(callback_list, lambda: self._before_epoch(-1))
        elif restore is not None and not self._hooked:
            self._before_epoch(-1)

    def _untrack(self) -> None:
        """The run's release: stdout is the user's again."""
        untrack_stdout(self._stdout)
        self._stdout = None

    def _hook_fit(self, callback_list: Any) -> None:
        """Hook into this fit's ``callback_list`` (None: not found) and find its input (see
        :mod:`candle_ckpt.keras.fit_hooks`)."""
        iterator = self._iterator = fit_hooks.find_epoch_iterator(self.model)
        siblings = [c for c in callback_list.callbacks if c is not self] if callback_list is not None else []
        train = TrainState(siblings, None, self.log.warning)
        train.model = self.model
        train.pipeline = Pipeline(iterator, train.warn_once) if iterator is not None else None
        batch = fit_internals.batch_size(iterator) if iterator is not None else None
        train.shape = EpochShape.make((self.params or {}).get("steps"), batch)
        self.run.held.validates = fit_internals.validated_epochs(self.model)  # a copy is held only for those
        self._train = train
        # Saves after every callback's on_epoch_end, the state put back before every on_epoch_begin (the run's).
        self._hooked = self.run.fit.hook_epochs(callback_list, self, self._after_epoch, self._before_epoch)
        if not self._hooked:
            train.warn_once(
                "could not reach the callback list of this fit: each checkpoint is taken in this callback's "
                "on_epoch_end, so changes that callbacks after it in the list make in the same epoch (a lowered "
                "learning rate) are not in it; put CandleCheckpointCallback last in callbacks=[...]"
            )

    def _before_epoch(self, epoch: int) -> None:
        """Before any callback's on_epoch_begin: put a resumed fit's training state back (its first epoch),
        and remember the epoch's beginning for a step checkpoint."""
        resumed = self.run.resumed
        if self._restore is not None and self._train is not None:
            data, self._restore = self._restore, None
            done = self._train.restore(data)
            self.log.info(f"restart: restored {', '.join(done) if done else 'no training state'}")
            if resumed is not None and resumed.sidecar.step is not None:
                resume_mid_epoch(self.model, self._iterator, self._train, resumed, self.engine, self.log, epoch)
        if self.run.enabled and self._train is not None:
            self._train.mark_epoch_begin()

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epochs_run += 1
        self._epoch = epoch
        if not self._hooked and self.run.enabled and self._train is not None:
            self._train.mark_epoch_begin()

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        step, steps = batch + 1, (self.params or {}).get("steps")
        last = isinstance(steps, int) and step >= steps
        capture = lambda copy=False: self._capture(step, copy)  # noqa: E731
        if self.run.step_end(self._epoch, step, logs or {}, capture, last=last, of=steps):
            self.model.stop_training = True

    def on_test_batch_end(self, batch: int, logs=None) -> None:  # progress; a request answered (capture.HeldStep)
        if self.run.validation_batch_end():  # with ckpt_preempt_exit_code=return: fit returns after this batch
            self.model.stop_evaluating = self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if self._hooked:  # saved by _after_epoch, once every callback's on_epoch_end has run
            self._logs = logs if logs is not None else {}
            return
        self._save(epoch, logs or {})

    def _after_epoch(self, epoch: int, logs: Any = None) -> None:
        self._save(epoch, self._logs)  # the logs the callbacks saw (the list's own conversion of them)

    def _capture(self, step: int | None = None, copy: bool = False):
        """The files of a save, taken on this thread; ``step``: a step checkpoint's (written at once, uncopied,
        unless ``copy``: a periodic one, written in the background as an epoch's is)."""
        if step is not None:
            internals.sync_jax_state(self.model)  # JAX keeps the state outside the variables: put it back first
        data, ended = None, None
        if self._train is not None:
            by = None if step is not None else self.run.fit.stopped_by(self._train.callbacks, self.model, self._epoch)
            data = self._train.capture(step, by, self._epoch + 1)
            ended = [by, self._epoch + 1] if by else None  # in the sidecar too, as tf_keras records it
        if self.group.size > 1:  # this process's part: its shards and its training state (this fit's group)
            cfg = self.cfg if step is None else self._sync_cfg
            build_optimizer(self.model)  # its variables are listed with the model's (every process builds it)
            cap = capture_sharded(
                self.model, cfg, self.run.fit_group, data, self._spare, internals.serialize_model_as_json
            )
        else:
            state = self._state or ModelState(self.model)
            cfg = self.cfg.replace(async_save=True) if copy else self.cfg if step is None else self._sync_cfg
            cap = capture_model(state, cfg)  # copy: an owned snapshot (held, or written in the background)
            if data is not None:
                cap.files.append(FileSpec(TRAIN_STATE_FILE, lambda f: f.write(data)))
                cap.nbytes += len(data)
        if ended:
            cap.extra["finished"] = ended
        return cap

    def _save(self, epoch: int, logs: Mapping[str, Any]) -> None:
        # Keras counts epochs from 0; a checkpoint is named after completed epochs.
        if self.run.stopped:
            return  # a step checkpoint stopped this fit in the middle of the epoch: it is no epoch's end
        epochs = (self.params or {}).get("epochs")
        last = isinstance(epochs, int) and epoch + 1 >= epochs
        if self.run.epoch_end(epoch + 1, logs, self._capture, last_epoch=last):
            self.model.stop_training = True

    def on_train_end(self, logs=None) -> None:
        if not self._finished and self._epochs_run == 0:  # a finished run's first epoch is undone by the run's end
            epochs = (self.params or {}).get("epochs")
            self.log.warning(
                f"fit() ran no epoch: initial_epoch was at or beyond epochs={epochs}; nothing was trained or saved"
            )
        self.run.end()  # joins the writer (its error raised with ckpt_on_error=raise), then lets go of all

    def close(self) -> None:
        """Release the writer lock now (it is released at the end of every ``fit`` anyway)."""
        self.run.close()

    def stats(self) -> dict[str, Any]:
        """Durations and MB/s of every save, writer waits and errors."""
        return self.engine.stats()

    def report_final(self) -> None:
        """Log a summary of this run's checkpoints (CANDLE's ``report_final``)."""
        self.engine.report()
