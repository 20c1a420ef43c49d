"""Reading a ``.weights.h5`` held in memory with Keras's own loader.

It relies on Keras's private ``_load_state``, ``H5IOStore`` and dataset
checks (through :mod:`candle_ckpt.keras.internals`). We
feed it the bytes that were just CRC-verified (an mmap of the file), so a
restart reads each file once.
"""

from __future__ import annotations

import io
from typing import Any

import keras
import numpy as np

from candle_ckpt.core.fileobj import BufferFile
from candle_ckpt.keras import internals


def load_weights_bytes(obj: Any, weights, *, objects_to_skip=()) -> None:
    """Load a ``.weights.h5`` held in memory (bytes, mmap or any buffer) into ``obj``.

    Uses Keras's own loader, strictly: a missing or mismatched variable raises.
    """
    source = BufferFile(weights)
    try:
        _load_weights_from(obj, source, objects_to_skip)
    finally:
        source.close()


class _ReadStore(internals.H5IOStore):
    """Keras's reading store, minus the copies h5py makes.

    ``H5IOStore.__getitem__`` returns ``np.array(dataset)``: h5py copies the
    bytes out of the file object into a zero-filled array and numpy copies that
    again. A contiguous, unfiltered dataset (what ``save_weights`` writes) is
    instead returned as a read-only view of the buffer at the dataset's offset,
    after the same safety checks (Keras's: no external or
    virtual datasets, no shape bombs). The backend's ``assign`` makes the one
    copy; where a backend may keep the array itself instead (JAX on CPU
    aliases aligned host arrays), the view is copied once first, so that no
    variable is left pointing into a file mapping.
    """

    def __init__(self, source: BufferFile) -> None:
        super().__init__(source, mode="r")
        self._buffer = source._view
        self._share = keras.backend.backend() in _COPYING_BACKENDS

    def __getitem__(self, key):
        dataset = internals.h5_dataset(self, key)
        if not dataset.shape or dataset.size == 0 or "dtype" in dataset.attrs:  # scalars, bfloat16: Keras's way
            return super().__getitem__(key)
        view = stored_view(dataset, self._buffer)
        if view is not None:
            return view if self._share else view.copy()
        out = np.empty(dataset.shape, dataset.dtype)
        dataset.read_direct(out)
        return out


# Backends whose assign copies a numpy array rather than keeping it (tested by
# tests/integration/keras/test_keras_format.py: the mapping closes after a restore).
_COPYING_BACKENDS = ("tensorflow",)


def stored_view(dataset, buffer: memoryview) -> np.ndarray | None:
    """A read-only array over ``dataset``'s bytes in ``buffer``, or None if they are not stored as is.

    Only contiguous datasets of plain numbers qualify (chunked ones may be
    filtered, and HDF5 may convert other types on reading).
    """
    dtype = dataset.dtype
    if dataset.chunks is not None or dtype.kind not in "biuf" or not dtype.isnative:
        return None
    offset = dataset.id.get_offset()
    count = dataset.size
    if offset is None or offset + count * dtype.itemsize > len(buffer):
        return None
    return np.frombuffer(buffer, dtype, count, offset).reshape(dataset.shape)


def _load_weights_from(obj: Any, source: io.BytesIO, objects_to_skip) -> None:
    store = _ReadStore(source)
    try:
        internals.load_state(obj, store, {id(o) for o in objects_to_skip})
    finally:
        store.close()
