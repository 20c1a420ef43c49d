"""The framework-free parts of ``train.state.npz``: its packing, the global RNGs every framework shares, and
other callbacks' state.

Both Keras adapters write the training state beside the weights as one
small ``.npz`` (a JSON document plus arrays, :func:`pack` / :func:`unpack`):
:mod:`candle_ckpt.keras.train_state` for Keras 3 and
:mod:`candle_ckpt.tf_keras.train_state` for tf_keras. Each holds, under
``rng``, at least Python's ``random`` and NumPy's legacy global
``np.random`` (:func:`capture_rng` / :func:`restore_rng`), and
TensorFlow's global ``tf.random.Generator`` once one exists
(:func:`capture_generator` / :func:`restore_generator`, given by each
adapter's gateway to TensorFlow); the Keras 3 adapter adds the op-seed
counter, Keras's and torch's global generators
(:mod:`candle_ckpt.keras.pipeline_state`). Capture copies (a few KB); it never
draws a number, so saving does not change the run.

**Other callbacks' state** is saved with each checkpoint and restored on resume.

Keras has no hook for it (Lightning has ``Callback.state_dict``); this is ours.
One rule for both frameworks: :class:`CallbackRule` is made with the module
of the framework's callbacks (``keras.callbacks`` or ``tf_keras.callbacks``,
whose classes have the same names and attributes), so this module imports
neither.

The protocol: a callback that defines ``get_state() -> dict`` and
``set_state(state: dict) -> None`` has that dict saved with every checkpoint
(values: JSON types or numpy arrays) and handed back to ``set_state`` when a
resumed ``fit`` starts, after every callback's ``on_train_begin`` (which
often resets counters) and before the first ``on_epoch_begin``.

Keras's own stateful callbacks are handled without it: ``EarlyStopping``
(wait, best, best epoch, best weights), ``ReduceLROnPlateau`` (wait,
cooldown, best; the rate itself is an optimizer variable, saved with the
optimizer), ``ModelCheckpoint`` (best) and ``CSVLogger(append=True)`` (the
size of its file at the save: a resumed run cuts off the rows written after
it, so a kill during a save leaves no row twice). Callbacks known to keep no state
across epochs (loggers, ``LearningRateScheduler`` whose rate lives in the
optimizer, CANDLE's ``TerminateOnTimeOut`` and ``CandleRemoteMonitor``) need
nothing. Any other callback gets one warning naming it.
"""

from __future__ import annotations

import io
import json
import os
import random
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

TRAIN_STATE_FILE = "train.state.npz"
_DOC = "__doc__"
_NP_KEY = "rng.numpy.keys"
_TF_KEY = "rng.tf_global.state"


def pack(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """Serialize a document and its arrays as one compressed ``.npz`` (no pickle).

    The document is compact JSON stored as its UTF-8 bytes (``uint8``): a NumPy
    string array would take 4 bytes a character.
    """
    text = json.dumps(doc, separators=(",", ":"))
    buf = io.BytesIO()
    np.savez_compressed(buf, **{_DOC: np.frombuffer(text.encode("utf-8"), np.uint8)}, **arrays)
    return buf.getvalue()


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`; also reads the first form, the JSON as a NumPy string (before issue 27)."""
    with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as npz:
        raw = npz[_DOC]
        text = raw.tobytes().decode("utf-8") if raw.dtype == np.uint8 else str(raw)
        doc = json.loads(text)
        arrays = {k: npz[k] for k in npz.files if k != _DOC}
    return doc, arrays


def capture_rng() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return (JSON-able document, arrays) of Python's ``random`` and NumPy's global state."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    doc = {"python": [version, list(internal), gauss], "numpy": [name, int(pos), int(has_gauss), float(cached)]}
    return doc, {_NP_KEY: np.array(keys, copy=True)}


def restore_rng(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
    """Set the states :func:`capture_rng` saved; return their names."""
    version, internal, gauss = doc["python"]
    random.setstate((version, tuple(internal), gauss))
    name, pos, has_gauss, cached = doc["numpy"]
    np.random.set_state((name, arrays[_NP_KEY], pos, has_gauss, cached))
    return ["python", "numpy"]


def capture_generator(gen: Any, doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Add the state of TensorFlow's global generator ``gen`` (None: there is none yet) to ``doc`` and ``arrays``."""
    if gen is not None:
        doc["tf_global"] = {"algorithm": int(gen.algorithm)}
        arrays[_TF_KEY] = np.array(gen.state.numpy(), copy=True)


def restore_generator(get: Callable[[], Any], doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
    """Reset the global generator (``get()``: ``tf.random.get_global_generator``) to the state
    :func:`capture_generator` saved, if any and of the same algorithm; return ``["tf_global"]`` if set."""
    if "tf_global" not in doc or _TF_KEY not in arrays:
        return []
    gen = get()
    if int(gen.algorithm) != int(doc["tf_global"]["algorithm"]):
        return []
    gen.reset(arrays[_TF_KEY])
    return ["tf_global"]


# -- other callbacks' state -------------------------------------------------------------------------------------
# Kept per class (by its name in the framework's callbacks module): the attributes that carry state
# from one epoch to the next.
KNOWN: dict[str, tuple[str, ...]] = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "cooldown_counter", "best"),
    "ModelCheckpoint": ("best", "_batches_seen_since_last_saving", "_last_batch_seen"),
}
# Classes (by name, so that candle_lib's need not be importable) that keep no
# state across epochs, or whose state lives elsewhere (the optimizer's rate).
STATELESS = frozenset(
    {
        "History",
        "ProgbarLogger",
        "TerminateOnNaN",
        "LearningRateScheduler",
        "TensorBoard",
        "RemoteMonitor",
        "BackupAndRestore",
        "TerminateOnTimeOut",
        "CandleRemoteMonitor",
        "CandleCheckpointCallback",
    }
)


def _file_state(path: str | None) -> dict[str, Any]:
    """The appended file's size now (None if it does not exist)."""
    return {"file_bytes": os.path.getsize(path) if path and os.path.exists(path) else None}


def _restore_file(path: str | None, state: dict[str, Any], warn: Callable[[str], None]) -> None:
    """Cut the appended file back to its size at the save: the rows after it are written again."""
    size = state.get("file_bytes")
    if path is None or size is None or not os.path.exists(path):
        return
    now = os.path.getsize(path)
    if now > size:
        os.truncate(path, size)
    elif now < size:
        warn(f"restart: {path} is shorter ({now} bytes) than at the checkpoint ({size}); it is left as it is")


def has_protocol(obj: Any) -> bool:
    """True if ``obj`` offers ``get_state()`` and ``set_state(state)``."""
    return callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))


def _plain(value: Any) -> Any:
    """A JSON-able copy of a scalar (numpy scalars become Python numbers)."""
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # a scalar tensor or variable
        return np.asarray(value.numpy()).item()
    return value


def _keys(callbacks: Iterable[Any]) -> list[tuple[str, Any]]:
    """Stable names for callbacks across runs: class name and occurrence (``EarlyStopping#0``)."""
    seen: dict[str, int] = {}
    out = []
    for cb in callbacks:
        name = type(cb).__name__
        out.append((f"{name}#{seen.get(name, 0)}", cb))
        seen[name] = seen.get(name, 0) + 1
    return out


class CallbackRule:
    """The rule for one framework's callbacks.

    Args:
        module: The framework's callbacks module (``keras.callbacks`` or ``tf_keras.callbacks``).
    """

    def __init__(self, module: Any) -> None:
        self.module = module
        self.known = {getattr(module, name): attrs for name, attrs in KNOWN.items()}
        self.base = set(vars(module.Callback()))  # the attributes every callback has

    def _appended_file(self, cb: Any) -> str | None:
        """The file a ``CSVLogger(append=True)`` adds a row to at every epoch end, else None."""
        if isinstance(cb, self.module.CSVLogger) and cb.append:
            return cb.filename
        return None

    def _known_attrs(self, cb: Any) -> tuple[str, ...] | None:
        for cls, attrs in self.known.items():
            if isinstance(cb, cls):
                return attrs
        return None

    def _own_attributes(self, cb: Any) -> list[str]:
        """Instance attributes beyond those every callback has (a stateless callback has none)."""
        return sorted(k for k in vars(cb) if k not in self.base)

    def unsaved(self, callbacks: Iterable[Any]) -> list[tuple[str, list[str]]]:
        """(name, attributes) of callbacks with attributes of their own whose state nothing saves
        (neither the protocol, a known type nor a known stateless class)."""
        return [
            (type(cb).__name__, attrs)
            for cb in callbacks
            if not has_protocol(cb)
            and self._known_attrs(cb) is None
            and type(cb).__name__ not in STATELESS
            and not isinstance(cb, self.module.CSVLogger)
            and (attrs := self._own_attributes(cb))
        ]

    def unsaved_messages(self, callbacks: Iterable[Any]) -> list[str]:
        """One warning for each callback :meth:`unsaved` names (said at the first save: its attributes exist)."""
        return [
            f"callback {name} has attributes ({', '.join(attrs)}) but no get_state()/set_state() and is not "
            "one candle_ckpt knows: if they carry state across epochs, a resumed run starts them fresh; add "
            "get_state() -> dict and set_state(dict) to it to have that state saved with each checkpoint"
            for name, attrs in self.unsaved(callbacks)
        ]

    def capture(self, callbacks: Iterable[Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Return (JSON-able document, arrays) with the state of every stateful callback."""
        doc: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        for key, cb in _keys(callbacks):
            if has_protocol(cb):
                state = dict(cb.get_state())
            elif (path := self._appended_file(cb)) is not None:
                state = _file_state(path)
            elif (attrs := self._known_attrs(cb)) is not None:
                state = {a: getattr(cb, a) for a in attrs if hasattr(cb, a)}
                if isinstance(cb, self.module.EarlyStopping) and cb.best_weights is not None:
                    state.update({f"best_weights/{i}": np.asarray(w) for i, w in enumerate(cb.best_weights)})
            else:
                continue
            entry: dict[str, Any] = {}
            for name, value in state.items():
                if isinstance(value, np.ndarray):
                    arrays[f"cb.{key}.{name}"] = np.array(value, copy=True)
                    entry[name] = {"__array__": f"cb.{key}.{name}"}
                else:
                    entry[name] = _plain(value)
            doc[key] = entry
        return doc, arrays

    def restore(
        self, callbacks: Iterable[Any], doc: dict[str, Any], arrays: dict[str, np.ndarray], warn: Callable[[str], None]
    ) -> list[str]:
        """Give each callback its saved state back; return the keys restored.

        A saved callback that is not in this run's list, or a stateful one with
        no saved state, is named in one warning each.
        """
        done = []
        for key, cb in _keys(callbacks):
            if not (has_protocol(cb) or self._known_attrs(cb) is not None or self._appended_file(cb) is not None):
                continue
            if key not in doc:
                warn(f"restart: the checkpoint holds no state for callback {key}; it starts fresh")
                continue
            state = {
                name: arrays[value["__array__"]] if isinstance(value, dict) and "__array__" in value else value
                for name, value in doc[key].items()
            }
            if has_protocol(cb):
                cb.set_state(state)
            elif self._appended_file(cb) is not None:
                _restore_file(self._appended_file(cb), state, warn)
            else:
                count = sum(1 for name in state if name.startswith("best_weights/"))
                weights = [state.pop(f"best_weights/{i}") for i in range(count)]
                for name, value in state.items():
                    setattr(cb, name, value)
                if isinstance(cb, self.module.EarlyStopping):
                    cb.best_weights = weights or None
            done.append(key)
        missing = sorted(set(doc) - {k for k, _ in _keys(callbacks)})
        if missing:
            warn(f"restart: the checkpoint holds state for callbacks not in this fit: {', '.join(missing)}")
        return done
