"""The small attributes of a ``PyDataset`` without ``get_state()``, saved so that a resumed run continues them.

Most Keras examples shuffle in place: ``np.random.shuffle(self.index)`` in
``on_epoch_end``. The order of epoch N then depends on every shuffle before
it, so replaying the last ``on_epoch_end`` is not enough. Instead, each
checkpoint holds the dataset's own attributes as they are at the save (after
the epoch's ``on_epoch_end``), and a resumed run puts them back before its
first epoch:

* NumPy arrays of plain numbers up to :data:`MAX_ARRAY_BYTES` each (an index,
  a permutation, a mask); an array the dataset still holds is overwritten in
  place, so views of it stay views;
* JSON values (numbers, strings, booleans, None, and lists, tuples and dicts
  of them) up to :data:`MAX_JSON_CHARS` each (a counter, a list of file names).

The cost does not grow with the number of epochs: one copy of these
attributes per checkpoint (``docs/exactness.rst`` has the figures).
An attribute of another kind (a DataFrame, a generator object) or a larger
array is not saved; if ``on_epoch_end`` rebinds it, one warning names it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

MAX_ARRAY_BYTES = 64 << 20
MAX_JSON_CHARS = 1 << 20
_PREFIX = "pipe.attr."
_PLAIN_KINDS = "biufcSU"


def _base_names() -> set[str]:
    """The attributes ``keras.utils.PyDataset.__init__`` sets (workers, queue size): not the dataset's state."""
    import keras

    return set(vars(keras.utils.PyDataset()))


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


def capture(dataset: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return (document, arrays) with the dataset's saveable attributes (copies: the save may be written later)."""
    base = _base_names()
    doc: dict[str, Any] = {"json": {}, "tuples": []}
    arrays: dict[str, np.ndarray] = {}
    for name, value in vars(dataset).items():
        if name in base:
            continue
        if isinstance(value, np.ndarray):
            if _saveable(value):
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


def watch_rebinding(dataset: Any, call: Callable[[], None], warn: Callable[[str], None]) -> None:
    """Run ``dataset.on_epoch_end`` (``call``); warn (the caller says each message once) if it rebinds an
    attribute that :func:`capture` cannot save."""
    before = {name: id(value) for name, value in vars(dataset).items()}
    call()
    changed = sorted(
        name
        for name, value in vars(dataset).items()
        if before.get(name) != id(value) and not _saveable(value) and name not in _base_names()
    )
    if changed:
        warn(
            f"{type(dataset).__name__}.on_epoch_end() changes {', '.join(changed)}, which candle_ckpt cannot save "
            f"(only NumPy arrays up to {MAX_ARRAY_BYTES >> 20} MiB and JSON values are): a resumed run will not be "
            "bit-identical; add get_state() -> dict and set_state(dict) to the dataset"
        )
