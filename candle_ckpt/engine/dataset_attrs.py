"""The small attributes of a ``PyDataset`` (or tf_keras ``Sequence``) without ``get_state()``, saved so that a
resumed run continues them.

Most Keras examples shuffle in place: ``np.random.shuffle(self.index)`` in
``on_epoch_end``. The order of epoch N then depends on every shuffle before
it, so replaying the last ``on_epoch_end`` is not enough. Instead, each
checkpoint holds the dataset's own attributes as they are at the save (after
the epoch's ``on_epoch_end``), and a resumed run puts them back before its
first epoch:

* NumPy arrays of integers or booleans up to :data:`MAX_ARRAY_BYTES` each (an
  index, a permutation, a mask), and any other array up to that size that
  ``on_epoch_end`` rebinds or changes in place (noticed by a fingerprint of
  4096 sampled elements taken around each call); the data arrays it only
  reads are not copied. An array the dataset still holds is overwritten in
  place on resume, so views of it stay views;
* JSON values (numbers, strings, booleans, None, and lists, tuples and dicts
  of them) up to :data:`MAX_JSON_CHARS` each (a counter, a list of file names).

The cost does not grow with the number of epochs: one copy of these
attributes per checkpoint (``docs/exactness.rst`` has the figures).
An attribute of another kind (a DataFrame, a generator object) or a larger
array is not saved; if ``on_epoch_end`` changes it, one warning names it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

MAX_ARRAY_BYTES = 64 << 20
MAX_JSON_CHARS = 1 << 20
_PREFIX = "pipe.attr."
_PLAIN_KINDS = "biufcSU"
_INDEX_KINDS = "biu"  # index-like arrays: always saved
_SAMPLES = 4096


def _json_value(value: Any) -> Any:
    """``value`` as JSON text if it is a small JSON value, else None."""
    if isinstance(value, (bool, int, float, str, type(None), list, tuple, dict)):
        try:
            text = json.dumps(value, allow_nan=True)
        except (TypeError, ValueError):
            return None
        return text if len(text) <= MAX_JSON_CHARS else None
    return None


def _saveable(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind in _PLAIN_KINDS and value.nbytes <= MAX_ARRAY_BYTES
    return _json_value(value) is not None


def capture(dataset: Any, changed: set[str], base: set[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return (document, arrays) with the dataset's state (copies: the save may be written later).

    Args:
        dataset: The ``PyDataset`` (Keras 3) or ``Sequence`` (tf_keras).
        changed: Attributes that ``on_epoch_end`` has rebound or changed in place (see :func:`watch`).
        base: The attributes the framework's base class sets (workers, queue size): not the dataset's state.
    """
    doc: dict[str, Any] = {"json": {}, "tuples": [], "changed": sorted(changed)}
    arrays: dict[str, np.ndarray] = {}
    for name, value in vars(dataset).items():
        if name in base:
            continue
        if isinstance(value, np.ndarray):
            if _saveable(value) and (value.dtype.kind in _INDEX_KINDS or name in changed):
                arrays[_PREFIX + name] = np.array(value, copy=True)
            continue
        text = _json_value(value)
        if text is not None:
            doc["json"][name] = text
            if isinstance(value, tuple):
                doc["tuples"].append(name)
    return doc, arrays


def restore(dataset: Any, doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
    """Put the attributes of :func:`capture` back into ``dataset``; return their names."""
    done = []
    for key, saved in arrays.items():
        if not key.startswith(_PREFIX):
            continue
        name = key[len(_PREFIX) :]
        current = getattr(dataset, name, None)
        if (
            isinstance(current, np.ndarray)
            and current.shape == saved.shape
            and current.dtype == saved.dtype
            and current.flags.writeable
        ):
            np.copyto(current, saved)
        else:
            setattr(dataset, name, np.array(saved, copy=True))
        done.append(name)
    tuples = set(doc.get("tuples", []))
    for name, text in doc.get("json", {}).items():
        value = json.loads(text)
        setattr(dataset, name, tuple(value) if name in tuples else value)
        done.append(name)
    return sorted(done)


def _fingerprint(value: Any) -> Any:
    """The object and, for an array, a CRC of 4096 of its elements spread over it (microseconds, any size)."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in _PLAIN_KINDS:
        return id(value)
    flat = value.reshape(-1)
    sample = np.ascontiguousarray(flat[:: max(1, flat.size // _SAMPLES)])
    return (id(value), value.shape, value.dtype.str, zlib.crc32(sample.view(np.uint8) if sample.size else b""))


def watch(
    dataset: Any, call: Callable[[], None], changed: set[str], warn: Callable[[str], None], base: set[str]
) -> None:
    """Run ``dataset.on_epoch_end`` (``call``); add what it rebinds or changes in place to ``changed``, and
    warn (the caller says each message once) if that is an attribute :func:`capture` cannot save
    (``base``: as for :func:`capture`)."""
    before = {name: _fingerprint(value) for name, value in vars(dataset).items()}
    call()
    now = {n for n, value in vars(dataset).items() if n not in base and before.get(n) != _fingerprint(value)}
    changed |= now
    lost = sorted(name for name in now if not _saveable(getattr(dataset, name)))
    if lost:
        warn(
            f"{type(dataset).__name__}.on_epoch_end() changes {', '.join(lost)}, which candle_ckpt cannot save "
            f"(only NumPy arrays up to {MAX_ARRAY_BYTES >> 20} MiB and JSON values are): a resumed run will not be "
            "bit-identical; add get_state() -> dict and set_state(dict) to the dataset"
        )
