"""``train.state.npz``: the training state beside the weights that an exact resume needs.

One small member of each checkpoint (listed in the sidecar, so CRC-checked), a JSON document plus arrays:
``rng``, the global RNG states (:func:`~candle_ckpt.keras.pipeline_state.capture_rngs`); ``callbacks``, the other
callbacks' state (:mod:`candle_ckpt.keras.callback_state`); ``pipeline``, the position of ``fit``'s input
(:mod:`candle_ckpt.keras.pipeline_state`). Captured after every callback's ``on_epoch_end`` of the saved epoch;
restored after every callback's ``on_train_begin`` of the resumed ``fit``, before its first epoch.

A step checkpoint's holds two moments (``mid``): the epoch's beginning (RNG states, tf.data iterators made:
:meth:`TrainState.mark_epoch_begin`), put back before the epoch begins (:meth:`TrainState.restore`) so the input
draws the epoch's order as before and the done steps are skipped; and the save (RNG states, callbacks, metric
variables), put back after them (:meth:`TrainState.restore_mid`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from candle_ckpt.core.log import SaidOnce
from candle_ckpt.engine.epoch_shape import EpochShape
from candle_ckpt.engine.state_file import TRAIN_STATE_FILE, pack, unpack
from candle_ckpt.keras import callback_state
from candle_ckpt.keras.pipeline_state import Pipeline, capture_rngs, restore_rngs

__all__ = ["TRAIN_STATE_FILE", "TrainState", "pack", "unpack"]


class TrainState:
    """Capture and restore the training state of one ``fit`` (see the module docstring).

    Args:
        callbacks: The ``fit``'s callbacks, this one excluded.
        pipeline: The ``fit``'s input, or None if it could not be found.
        warn: Logs a warning; each message is logged once.
    """

    def __init__(self, callbacks: list[Any], pipeline: Pipeline | None, warn: Callable[[str], None]) -> None:
        self.callbacks = callbacks
        self.pipeline = pipeline
        self.warn_once = SaidOnce(warn)
        self._checked = False
        self.model: Any = None  # whose metric variables a step checkpoint holds
        self.shape = EpochShape()  # this fit's epoch: its steps and their batch size, kept in a step checkpoint
        self._begin: tuple[dict[str, Any], dict[str, np.ndarray], int | None] | None = None
        self._mid: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None  # waiting for restore_mid

    def _check_callbacks(self) -> None:
        """At the first save (their attributes exist by then): name callbacks whose state nothing saves."""
        self._checked = True
        for message in callback_state.RULE.unsaved_messages(self.callbacks):
            self.warn_once(message)

    def mark_epoch_begin(self) -> None:
        """Remember the epoch's beginning (before every callback's ``on_epoch_begin``) for a step checkpoint."""
        doc, arrays = capture_rngs()
        iterators = self.pipeline.iterators if self.pipeline is not None and self.pipeline.kind == "tf.data" else None
        self._begin = (doc, arrays, iterators)
        if self.pipeline is not None:
            self.pipeline.mark_epoch_begin()

    def capture(self, step: int | None = None, finished: str | None = None, epoch: int = 0) -> bytes:
        """The packed state now (on the training thread: the bytes own their data).

        Args:
            step: For a step checkpoint, the steps done in this epoch (see the module docstring).
            finished: The callback that ended the run for good at this epoch end (see
                :meth:`candle_ckpt.engine.fit_port.FitPlumbing.stopped_by`), recorded with ``epoch`` (completed epochs).
        """
        if not self._checked:
            self._check_callbacks()
        doc: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        parts = [("rng", capture_rngs), ("callbacks", lambda: callback_state.capture(self.callbacks))]
        if self.pipeline is not None:
            pipeline = self.pipeline
            parts.append(("pipeline", lambda: pipeline.capture(mid=step is not None and self._begin is not None)))
        for name, fn in parts:
            doc[name], more = fn()
            arrays.update(more)
        if finished is not None:
            doc["finished"] = {"by": finished, "epoch": epoch}
        if step is not None and self._begin is not None:
            begin_doc, begin_arrays, iterators = self._begin
            # The epoch's shape, read as attributes: a step checkpoint's capture calls nothing more (the walks)
            doc["mid"] = {"step": step, "rng_begin": begin_doc, "of": self.shape.steps, "batch": self.shape.batch}
            arrays.update({f"begin.{k}": v for k, v in begin_arrays.items()})
            if iterators is not None:  # the iterators made before this epoch's (it is made again on resume)
                doc["pipeline"]["iterators"] = iterators
            values = [np.array(v.numpy(), copy=True) for v in getattr(self.model, "metrics_variables", [])]
            doc["mid"]["metrics"] = len(values)
            arrays.update({f"metric.{i}": v for i, v in enumerate(values)})
        return pack(doc, arrays)

    def restore(self, data: bytes) -> list[str]:
        """Put the state of ``data`` back; return what was restored, for the log.

        For a step checkpoint, only the epoch's beginning: the rest waits for :meth:`restore_mid`.
        """
        doc, arrays = unpack(data)
        if "mid" in doc:
            self._mid = (doc, arrays)
            done = []
            if self.pipeline is not None and "pipeline" in doc:
                self.pipeline.restore(doc["pipeline"], arrays)
                done.append(f"input ({self.pipeline.kind}{self.pipeline.note})")
            begin = {k[len("begin.") :]: v for k, v in arrays.items() if k.startswith("begin.")}
            return done + [f"rng:{n}@epoch-begin" for n in restore_rngs(doc["mid"]["rng_begin"], begin)]
        return self._restore_now(doc, arrays)

    def saved_shape(self) -> EpochShape:
        """The epoch's shape when the step checkpoint being resumed was taken (after :meth:`restore`)."""
        return EpochShape.of(self._mid[0]["mid"]) if self._mid is not None else EpochShape()

    def restore_mid(self) -> list[str]:
        """After the resumed epoch's skipped steps: the callbacks, metric variables and RNGs of the save."""
        if self._mid is None:
            return []
        (doc, arrays), self._mid = self._mid, None
        done = callback_state.restore(self.callbacks, doc.get("callbacks", {}), arrays, self.warn_once)
        variables = list(getattr(self.model, "metrics_variables", []))
        if len(variables) == doc["mid"].get("metrics"):
            for i, variable in enumerate(variables):
                variable.assign(arrays[f"metric.{i}"])
            done.append(f"{len(variables)} metric variables")
        else:
            self.warn_once(
                f"restart: the checkpoint holds {doc['mid'].get('metrics')} metric variables but the model has "
                f"{len(variables)}: this epoch's metrics count only the steps run after the restart"
            )
        return done + [f"rng:{n}" for n in restore_rngs(doc["rng"], arrays)]

    def _restore_now(self, doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
        done = callback_state.restore(self.callbacks, doc.get("callbacks", {}), arrays, self.warn_once)
        if self.pipeline is not None and "pipeline" in doc:
            self.pipeline.restore(doc["pipeline"], arrays)
            done.append(f"input ({self.pipeline.kind}{self.pipeline.note})")
        if "rng" in doc:  # last: a replayed PyDataset.on_epoch_end draws from the RNGs first
            done += [f"rng:{name}" for name in restore_rngs(doc["rng"], arrays)]
        return done
