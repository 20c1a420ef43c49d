"""``CandleCheckpointCallback``: CANDLE's checkpoint callback for ``model.fit``.

It holds no file logic: each epoch end becomes one call to the shared
:class:`~candle_ckpt.engine.engine.CheckpointEngine`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import keras

from candle_ckpt.adapters import is_tf_keras
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import LineTracker, OpsLog, get_logger, track_stdout, untrack_stdout
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.fit_guard import FitGuard
from candle_ckpt.engine.writer import SigtermExit
from candle_ckpt.keras.candle_h5 import apply_pending
from candle_ckpt.keras.capture import capture_model
from candle_ckpt.keras.state import ModelState


class CandleCheckpointCallback(keras.callbacks.Callback):
    """Checkpoint every epoch that the ``ckpt_*`` parameters say to keep.

    Args:
        gParameters: The job's parameter dict (``ckpt_*`` keys and ``epochs``).
        logger: ``"DEFAULT"`` (the ``candle_ckpt`` logger), a
            :class:`logging.Logger`, or None for ``ckpt.log`` only.
        verbose: Print progress to the console (with ``logger="DEFAULT"``).

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
    """

    def __init__(
        self,
        gParameters: Mapping[str, Any],
        logger: str | logging.Logger | None = "DEFAULT",
        verbose: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.cfg = CkptConfig.from_params(gParameters, require_epochs=True)
        self.ops = OpsLog(Layout.at(self.cfg.directory).log, get_logger(logger, verbose))
        if kwargs.keys() - {"fs"}:
            raise TypeError(f"unexpected arguments: {sorted(kwargs.keys() - {'fs'})}")
        # Opening checks the directory now (writable, not held by another writer), not at epoch 50.
        self.engine = CheckpointEngine(self.cfg, self.ops, fs=kwargs.pop("fs", None))
        self.engine.close()  # held again from on_train_begin to on_train_end
        self._state: ModelState | None = None
        self._sigterm = SigtermExit()
        self._guard = FitGuard(self._fit_ended)
        self._stdout: LineTracker | None = None

    def set_model(self, model) -> None:
        if is_tf_keras(model):
            raise TypeError(
                "this is the Keras 3 CandleCheckpointCallback but the model is a tf_keras (Keras 2) model; use "
                "candle_ckpt.tf_keras.adapter.CandleCheckpointCallback (or set TF_USE_LEGACY_KERAS=1 before importing)"
            )
        super().set_model(model)

    def on_train_begin(self, logs=None) -> None:
        self.engine.open()  # the writer lock, for as long as this fit runs
        self._guard.arm()
        self._stdout = track_stdout()  # log records never continue the progress bar's line
        apply_pending(self.model, self.ops)  # optimizer state of a CANDLE model.h5 restored before compile()
        self._state = ModelState(self.model)
        # Async: SIGTERM (a scheduler's stop) becomes SystemExit, so the exit hook
        # commits the last snapshot instead of the process dying mid-write.
        self._sigterm.arm(self.engine.writer)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        # Keras counts epochs from 0; a checkpoint is named after completed epochs.
        state = self._state or ModelState(self.model)
        try:
            self.engine.save(epoch + 1, logs or {}, lambda: capture_model(state, self.cfg))
        except BaseException:
            # fit stops here without on_train_end: give SIGTERM its default back, and the lock up now
            # unless a write is in flight; then the guard waits for it on its own thread (this one
            # must unwind, so that a SIGTERM's exit hook can commit that write).
            self._sigterm.disarm()
            if not self.engine.writer.in_flight():
                self._guard.disarm()
                self._fit_ended()
            raise

    def on_train_end(self, logs=None) -> None:
        self._guard.disarm()
        try:
            self.engine.finish()  # joins the writer; raises its error with ckpt_on_error=raise
        finally:
            self._sigterm.disarm()
            self._fit_ended()

    def _fit_ended(self) -> None:
        """Release what this fit held: the writer lock (after the last write) and stdout."""
        untrack_stdout(self._stdout)
        self._stdout = None
        self.engine.close()

    def close(self) -> None:
        """Release the writer lock now (it is released at the end of every ``fit`` anyway)."""
        self._guard.disarm()
        self._fit_ended()

    def stats(self) -> dict[str, Any]:
        """Durations and MB/s of every save, writer waits and errors."""
        return self.engine.stats()

    def report_final(self) -> None:
        """Log a summary of this run's checkpoints (CANDLE's ``report_final``)."""
        self.engine.report()
