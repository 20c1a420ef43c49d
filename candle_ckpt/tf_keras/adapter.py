"""The same callback and ``restart()`` for tf_keras (Keras 2) models.

Keras 3's ``model.fit`` does not run under ``MultiWorkerMirroredStrategy``
(keras-team/keras#20585); tf_keras's does. With ``TF_USE_LEGACY_KERAS=1``,
``candle_ckpt.CandleCheckpointCallback`` is this module's class, so a script
that uses ``tf.keras`` changes nothing else. ``candle_ckpt.restart`` picks
this adapter for any tf_keras model.

A checkpoint holds tf_keras's own formats, written through the same commit
protocol (``work/``, CRC32s, sidecar, links):

* ``model_weights.h5``: tf_keras's legacy ``save_weights_to_hdf5_group``, the file
  tf_keras's ``model.save_weights("x.h5")`` writes (``model.load_weights`` reads it);
* ``optimizer.npz``: the optimizer's variables (``iterations``, slots) by
  position, with their names; legacy H5 weights do not hold them;
* ``model.h5`` unless ``ckpt_save_weights_only``: the full model
  (``tf_keras.models.load_model`` reads it; without the optimizer);
* ``random_layers.npz`` when random layers draw from ``tf.random.Generator``
  states (:mod:`~candle_ckpt.tf_keras.random_state`);
* ``train.state.npz``: the global RNGs, the other callbacks' state, a
  ``Sequence``'s attributes and the learning rate
  (:mod:`~candle_ckpt.tf_keras.train_state`).

A resumed ``fit`` on arrays reads the batches the uninterrupted one would
(``internals.fast_forward_input``): tf_keras's default ``shuffle=True`` resumes exactly.

Every worker of a multi-worker job goes through
:class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np
import tf_keras

import candle_ckpt.tf_keras.exactness as exactness
import candle_ckpt.tf_keras.internals as internals
import candle_ckpt.tf_keras.random_state as random_state
import candle_ckpt.tf_keras.train_state as train_state
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import NoValidCheckpoint
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.distributed.worker_state import WorkerTrainingState
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.pending import ParkedOptimizer, Pending
from candle_ckpt.engine.preempt_control import plain_logs
from candle_ckpt.engine.run import TrainingRun
from candle_ckpt.storage.store import FileSpec
from candle_ckpt.tf_keras.optimizer_state import (
    assign_optimizer_state,
    build_optimizer,
    check_optimizer_state,
    optimizer_variables,
)

# Not "model.weights.h5": tf_keras's load_weights reads a name ending in
# ".weights.h5" as the Keras 3 format, and this file is the legacy H5 format.
WEIGHTS_FILE = "model_weights.h5"
OPTIMIZER_FILE = "optimizer.npz"
FULL_MODEL_FILE = "model.h5"


def _h5_bytes(write) -> bytes:
    buf = io.BytesIO()
    with h5py.File(buf, "w") as h5:
        write(h5)
    return buf.getvalue()


def _bytes_writer(data: bytes):
    return lambda f: f.write(data)


class TfKerasModelAdapter:
    """Capture / restore one tf_keras model (see ``KerasModelAdapter`` for the protocol)."""

    reads = (WEIGHTS_FILE, OPTIMIZER_FILE, random_state.RANDOM_FILE, train_state.TRAIN_STATE_FILE)
    required = (WEIGHTS_FILE, OPTIMIZER_FILE)

    def __init__(self, model) -> None:
        self.model = model
        # State restore() could not apply yet (see candle_ckpt.engine.pending).
        self.pending = Pending()
        # (callback, completed epochs) when a callback ended the run at the epoch being saved (engine/finished.py).
        self.finished: tuple[str, int] | None = None
        # The training state beside the weights; the callback binds it to its fit (tf_keras/train_state.py).
        self.train: train_state.TfTrainState | None = None

    def capture(self, cfg: CkptConfig) -> Capture:
        """Serialize on the calling thread (the training thread), so the next step cannot change it."""
        model = self.model
        if not model.built:
            raise ValueError("the model is not built yet; build it (call it on data or model.build()) before saving")
        start = time.perf_counter()
        weights = _h5_bytes(lambda h5: internals.save_weights_to_h5(h5, model))
        opt_vars = optimizer_variables(model)
        arrays = [np.array(v.numpy(), copy=True) for v in opt_vars]
        names = np.array([v.name for v in opt_vars], dtype=str)

        def write_optimizer(f) -> None:
            np.savez(f, names=names, **{f"v{i}": a for i, a in enumerate(arrays)})

        files = [FileSpec(WEIGHTS_FILE, _bytes_writer(weights)), FileSpec(OPTIMIZER_FILE, write_optimizer)]
        nbytes = len(weights) + sum(a.nbytes for a in arrays)
        rng = random_state.capture(model)
        if rng is not None:
            files.append(FileSpec(random_state.RANDOM_FILE, _bytes_writer(rng)))
            nbytes += len(rng)
        if self.train is not None:
            state = self.train.capture(model)
            files.append(FileSpec(train_state.TRAIN_STATE_FILE, _bytes_writer(state)))
            nbytes += len(state)
        if not cfg.save_weights_only:
            full = _h5_bytes(lambda h5: internals.save_model_to_h5(h5, model))
            files.append(FileSpec(FULL_MODEL_FILE, _bytes_writer(full)))
            nbytes += len(full)
        return Capture(
            files=files,
            model_file=WEIGHTS_FILE,
            nbytes=nbytes,
            snapshot_s=time.perf_counter() - start,
            keras_version=f"tf_keras {tf_keras.__version__}",
            backend="tensorflow",
            extra={"finished": list(self.finished)} if self.finished is not None else {},
        )

    def build_optimizer(self) -> None:
        """Create the optimizer's variables (in the model's strategy scope) so they can be assigned."""
        build_optimizer(self.model)

    def restore(self, chosen, log, where: str) -> None:
        """Load a verified checkpoint into the model and its optimizer.

        Raises:
            NoValidCheckpoint: the checkpoint lacks a file this adapter needs.
            ValueError: the checkpoint does not match the model.
        """
        contents = chosen.contents
        missing = [n for n in self.required if n not in contents]
        if missing:
            raise NoValidCheckpoint(f"checkpoint {where} has no {', '.join(missing)} (not a tf_keras checkpoint?)")
        model = self.model
        if not model.built:
            raise ValueError("restart() needs a built model: build it (call it on data or use an Input layer) first")
        with np.load(io.BytesIO(contents[OPTIMIZER_FILE]), allow_pickle=False) as npz:
            names = [str(n) for n in npz["names"]]
            values = [npz[f"v{i}"] for i in range(len(names))]
        train = contents.get(train_state.TRAIN_STATE_FILE)
        self.pending = Pending(train_state=bytes(train) if train is not None else None)
        rng = contents.get(random_state.RANDOM_FILE)
        generators = random_state.check(model, bytes(rng) if rng is not None else None, where)
        if getattr(model, "optimizer", None) is None:
            # restart() before compile(): the optimizer does not exist yet; the
            # callback applies its state when fit starts (apply_optimizer_state).
            with h5py.File(io.BytesIO(contents[WEIGHTS_FILE]), "r") as h5:
                internals.load_weights_from_h5(h5, model)  # checks every layer before assigning
            self.pending.optimizer = ParkedOptimizer(values, names)
        else:
            build_optimizer(model)
            variables = optimizer_variables(model)
            check_optimizer_state(variables, names, values, f"{where}/{OPTIMIZER_FILE}")
            with h5py.File(io.BytesIO(contents[WEIGHTS_FILE]), "r") as h5:
                internals.load_weights_from_h5(h5, model)  # checks every layer before assigning
            for value, var in zip(values, variables, strict=True):  # checked above
                var.assign(value)
        random_state.assign(generators)
        unsaved = random_state.unsaved(model, rng, where)
        if unsaved is not None:
            log.warning(unsaved)

    def apply_optimizer_state(self, parked: ParkedOptimizer, where: str) -> None:
        """Assign optimizer state parked by a restore before ``compile()``, all or nothing."""
        assign_optimizer_state(self.model, parked.names or [], parked.values, where)


class CandleCheckpointCallback(tf_keras.callbacks.Callback):
    """``CandleCheckpointCallback`` for tf_keras ``model.fit``, single- or multi-worker.

    Same arguments, parameters and async behaviour (SIGTERM during an async
    ``fit`` commits the last snapshot) as the Keras 3 callback. The worker's
    role (chief or not) comes from the model's distribution strategy, so the
    directory is opened (locked, cleaned) when ``fit`` starts, before the
    first epoch, rather than when the callback is created.

    Args:
        gParameters: The job's parameter dict (``ckpt_*`` keys and ``epochs``).
        logger: ``"DEFAULT"``, a :class:`logging.Logger`, or None for ``ckpt.log`` only.
        verbose: Print progress to the console (with ``logger="DEFAULT"``).
        fs: The file-system seam every change on disk goes through
            (:class:`~candle_ckpt.core.fs.LocalFS`); None for the real one. Tests pass
            :class:`~candle_ckpt.testing.faultfs.FaultFS` to inject faults.
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
        self._params = dict(gParameters)
        self._logger, self._verbose = logger, verbose
        self._fs = fs
        self.state: WorkerTrainingState | None = None
        self.run: TrainingRun | None = None  # each fit's lifecycle (engine/run.py), made with the worker's state
        internals.keep_tensor_logs(self)  # batch logs stay tensors: no host sync per step for our hook
        self._epoch = 0
        self._skipped: tuple[int, int] | None = None  # (epoch, steps) a restored step checkpoint had done
        self._inexact: list[str] = []  # why a resume of this fit is not bit-identical (tf_keras/exactness.py)
        self._inexact_said = False
        self._hooked = False  # saves run after every callback's on_epoch_end (the run's epoch order)
        self._callbacks: list[Any] = []  # the other callbacks of this fit
        self._finished = False  # this fit is a finished run's rerun: it trains nothing (engine/finished.py)
        self._restore_callbacks: bytes | None = None  # train.state.npz, until the first on_epoch_begin

    def set_model(self, model) -> None:
        super().set_model(model)
        if self.state is None or self.state.adapter.model is not model:
            state = self.state = WorkerTrainingState(
                self._params,
                model,
                adapter=TfKerasModelAdapter(model),
                logger=self._logger,
                verbose=self._verbose,
                fs=self._fs,
            )
            self.cfg = state.cfg  # ckpt_async=auto decided by the worker state: capture as the writer writes
            self.run = TrainingRun(
                self.cfg,
                state.engine,
                state.log,
                group=state.group,
                who=state.info.name,
                port=internals,  # the callback list, the epoch order, the first epoch (engine/fit_port.py)
                on_release=self._unhook_fit,
            )

    def on_train_begin(self, logs=None) -> None:
        # First: a fit that raises releases the lock, and an earlier fit's release under way ends here.
        # The guard, the writer lock (chief), the group's scope, the signals; what restart() attached (before or
        # after __init__), adopted.
        listed = self.run.begin(self, model=self.model)
        resumed = self.run.resumed
        adapter = self.state.adapter
        data = self.run.take_parked(lambda parked, at: adapter.apply_optimizer_state(parked, f"{at}/{OPTIMIZER_FILE}"))
        # After a step checkpoint, the fit of that epoch's rest starts at batch 0 of the rest.
        side = resumed.sidecar if resumed is not None else None
        self._skipped = (side.epoch, side.step) if side is not None and side.step is not None else None
        ended = side.extra.get("finished") if side is not None else None  # recorded by an EarlyStopping's save
        epochs = (self.params or {}).get("epochs")
        # First: where this fit starts (a finished run's past its end, a resumed one's after the restored epoch).
        self._finished = self.run.finished(tuple(ended) if ended else None, epochs, model=self.model)
        fit_args = internals.fit_arguments(self.model)
        forwarded = resumed is not None and fit_args is not None and internals.fast_forward_input(self.model, fit_args)
        self._inexact = exactness.inexact_causes(self.model, fit_args, forwarded)  # said at a save
        self._hook_epoch_end(listed)
        self._bind_train_state(resumed, data, fit_args)

    def _bind_train_state(self, resumed, data: bytes | None, fit_args) -> None:
        """Bind ``train.state.npz`` to this fit; after a restore, put back what must precede the first epoch."""
        adapter = self.state.adapter
        if adapter.train is None:
            adapter.train = train_state.TfTrainState(self.state.log.warning)
        adapter.train.bind(self._callbacks, fit_args)
        self._restore_callbacks = data  # at the first on_epoch_begin, after every callback's on_train_begin
        if data is not None and resumed.sidecar.step is not None and adapter.train.sequence is not None:
            self.state.log.warning(
                f"restart: {self.run.where} is a mid-epoch checkpoint: the global "
                f"RNGs and the attributes of the Sequence {type(adapter.train.sequence).__name__} are put back only "
                "from epoch checkpoints, so this fit reads and draws otherwise than an uninterrupted run; for an exact "
                "resume, resume from the last epoch checkpoint (ckpt_restart_epoch)"
            )
        if data is not None:
            done = adapter.train.restore_input(data, self.model, epoch_end=resumed.sidecar.step is None)
            self.state.log.info(f"restart: restored {', '.join(done) or 'nothing'} of {train_state.TRAIN_STATE_FILE}")

    def _hook_epoch_end(self, listed) -> None:
        """Save after every callback's on_epoch_end (EarlyStopping's decision included), whatever the order."""
        self._callbacks = [c for c in listed.callbacks if c is not self] if listed is not None else []
        self._hooked = self.run.fit.hook_epochs(listed, self, self._epoch_end)  # undone when the run lets go

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epoch = epoch
        data, self._restore_callbacks = self._restore_callbacks, None
        if data is not None:
            done = self.state.adapter.train.restore_callbacks(data)
            self.state.log.info(f"restart: restored the state of callbacks {', '.join(done) or '(none)'}")

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        # Every worker, every step: all agree on a preemption at the same step and save it there.
        steps = (self.params or {}).get("steps")
        if not self.run.enabled:
            return
        done, epoch = batch + 1, self._epoch
        last = isinstance(steps, int) and done >= steps  # a request is answered by the epoch checkpoint
        if self._skipped is not None and self._skipped[0] == epoch:
            done += self._skipped[1]
        capture = lambda copy=False: self.state.adapter.capture(self.cfg)  # noqa: E731  (copies when async)
        if self.run.step_end(epoch, done, plain_logs(logs), capture, last=last):
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if not self._hooked:  # fit's callback list was not found: save here, before the callbacks after this one
            self._epoch_end(epoch, logs)

    def _epoch_end(self, epoch: int, logs=None) -> None:
        if self.run.stopped:
            return  # preempted in mid-epoch: that step's checkpoint is the newest state
        if self._inexact and self.cfg.save_interval and not self._inexact_said:
            self._inexact_said = True
            self.state.log.warning(exactness.inexact_message(self._inexact))
        adapter = self.state.adapter
        by = self.run.fit.stopped_by(self._callbacks, self.model, epoch)
        adapter.finished = (by, epoch + 1) if by else None  # recorded by this epoch's saves only
        # tf_keras counts epochs from 0; a checkpoint is named after completed epochs.
        last = epoch + 1 >= (self.params or {}).get("epochs", epoch + 2)
        try:
            if self.run.epoch_end(epoch + 1, logs or {}, lambda: adapter.capture(self.cfg), last_epoch=last):
                self.model.stop_training = True
        finally:
            adapter.finished = None

    def _unhook_fit(self) -> None:
        if self.state is not None and self.state.adapter.train is not None:
            self.state.adapter.train.unbind()

    def on_train_end(self, logs=None) -> None:
        self.run.end()  # the last write lands, the signals come back, the lock is let go
        self.state.delete_backup()  # a non-chief's scratch directory

    @property
    def preempted(self) -> tuple[int, int] | None:
        """``(epoch, steps done)`` of the preemption save of the last ``fit`` (0-based epoch), else None."""
        return self.run.saved_at if self.run is not None else None

    def stats(self) -> dict[str, Any]:
        """Durations and MB/s of every save, writer waits and errors."""
        return self.state.engine.stats() if self.state is not None else {}

    def report_final(self) -> None:
        """Log a summary of this run's checkpoints (CANDLE's ``report_final``)."""
        if self.state is not None:
            self.state.engine.report()
