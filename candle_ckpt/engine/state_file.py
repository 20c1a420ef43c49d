"""The framework-free parts of ``train.state.npz``: its packing, and the global RNGs every framework shares.

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
(:mod:`candle_ckpt.keras.rng_state`). Capture copies (a few KB); it never
draws a number, so saving does not change the run.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
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
