"""``train.state.npz``: the training state beside the weights that an exact resume needs.

One small member of each checkpoint (listed in the sidecar, so CRC-checked
like the others) holding, as a JSON document plus arrays:

* ``rng``: the global RNG states (:mod:`candle_ckpt.keras.rng_state`);
* ``callbacks``: the other callbacks' state (:mod:`candle_ckpt.keras.callback_state`);
* ``pipeline``: the position of ``fit``'s input (:mod:`candle_ckpt.keras.pipeline_state`).

It is captured on the training thread after every callback's
``on_epoch_end`` of the saved epoch, and restored after every callback's
``on_train_begin`` of the resumed ``fit``, before its first epoch.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from candle_ckpt.keras import callback_state, rng_state
from candle_ckpt.keras.pipeline_state import Pipeline

TRAIN_STATE_FILE = "train.state.npz"
_DOC = "__doc__"


def pack(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """Serialize a document and its arrays as one ``.npz`` (no pickle)."""
    buf = io.BytesIO()
    np.savez(buf, **{_DOC: np.array(json.dumps(doc))}, **arrays)
    return buf.getvalue()


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`."""
    with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as npz:
        doc = json.loads(str(npz[_DOC]))
        arrays = {k: npz[k] for k in npz.files if k != _DOC}
    return doc, arrays


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
        self._said: set[str] = set()
        self._warn = warn
        self._checked = False

    def _check_callbacks(self) -> None:
        """At the first save (their attributes exist by then): name callbacks whose state nothing saves."""
        self._checked = True
        for name, attrs in callback_state.unsaved(self.callbacks):
            self.warn_once(
                f"callback {name} has attributes ({', '.join(attrs)}) but no get_state()/set_state() and is not "
                "one candle_ckpt knows: if they carry state across epochs, a resumed run starts them fresh; add "
                "get_state() -> dict and set_state(dict) to it to have that state saved with each checkpoint"
            )

    def warn_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self._warn(message)

    def capture(self) -> bytes:
        """The packed state now (on the training thread: the bytes own their data)."""
        if not self._checked:
            self._check_callbacks()
        doc: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        parts = [("rng", rng_state.capture), ("callbacks", lambda: callback_state.capture(self.callbacks))]
        if self.pipeline is not None:
            parts.append(("pipeline", self.pipeline.capture))
        for name, fn in parts:
            doc[name], more = fn()
            arrays.update(more)
        return pack(doc, arrays)

    def restore(self, data: bytes) -> list[str]:
        """Put the state of ``data`` back; return what was restored, for the log."""
        doc, arrays = unpack(data)
        done = callback_state.restore(self.callbacks, doc.get("callbacks", {}), arrays, self.warn_once)
        if self.pipeline is not None and "pipeline" in doc:
            self.pipeline.restore(doc["pipeline"], arrays)
            done.append(f"input ({self.pipeline.kind})")
        if "rng" in doc:  # last: a replayed PyDataset.on_epoch_end draws from the RNGs first
            done += [f"rng:{name}" for name in rng_state.restore(doc["rng"], arrays)]
        return done
