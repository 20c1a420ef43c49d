"""An async multi-process capture copies into the last capture's buffers once they are written, never before."""

from __future__ import annotations

import keras
import numpy as np

from candle_ckpt.core.group import SOLO
from candle_ckpt.multihost.save import SpareChunks, capture_chunks


def _variables() -> dict[str, keras.Variable]:
    return {
        "dense/kernel": keras.Variable(np.arange(12, dtype="float32").reshape(3, 4), name="kernel"),
        "dense/bias": keras.Variable(np.ones(5, "float32"), name="bias"),
    }


def test_an_async_capture_reuses_written_buffers_and_never_busy_ones():
    variables, spare = _variables(), SpareChunks()
    first, _ = capture_chunks(variables, SOLO, copy=True, spare=spare)
    busy, _ = capture_chunks(variables, SOLO, copy=True, spare=spare)  # the first is not written yet: new buffers
    assert [c.path for c in first] == ["dense/kernel", "dense/bias"]
    assert not any(np.shares_memory(a.data, b.data) for a, b in zip(first, busy, strict=True))
    spare.written()
    variables["dense/kernel"].assign(np.full((3, 4), 7.0, "float32"))
    again, _ = capture_chunks(variables, SOLO, copy=True, spare=spare)
    assert all(np.shares_memory(a.data, b.data) for a, b in zip(busy, again, strict=True))
    assert np.array_equal(again[0].data, np.full((3, 4), 7.0, "float32"))
    assert np.array_equal(again[1].data, np.ones(5, "float32"))
    # the copy owns its memory: training may change the variable while the writer reads the chunk
    variables["dense/kernel"].assign(np.zeros((3, 4), "float32"))
    assert np.array_equal(again[0].data, np.full((3, 4), 7.0, "float32"))


def test_a_sync_capture_copies_nothing_and_leaves_the_spare_buffers_alone():
    variables, spare = _variables(), SpareChunks()
    taken, _ = capture_chunks(variables, SOLO, copy=True, spare=spare)
    spare.written()
    capture_chunks(variables, SOLO, copy=False, spare=spare)
    again, _ = capture_chunks(variables, SOLO, copy=True, spare=spare)
    assert all(np.shares_memory(a.data, b.data) for a, b in zip(taken, again, strict=True))
