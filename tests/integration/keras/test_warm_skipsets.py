"""Tripwire of ``internals.warm_skipsets``: Keras's saving skip sets are built once, outside any distribution.

Under a ``keras.distribution`` spanning several processes, the first save-plan walk would create
``Optimizer(1.0)``'s variables (a cross-process collective) on whichever process walks first.
"""

from __future__ import annotations

import keras
from keras.src.backend.common import global_state
from keras.src.saving import saving_lib

from candle_ckpt.keras import internals


def test_skipsets_are_cached_and_the_distribution_is_put_back():
    """After warm_skipsets every skip set Keras asks for is cached (no reference Optimizer is built again), and the
    active distribution is unchanged."""
    dist = keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:1])
    keras.distribution.set_distribution(dist)
    try:
        internals.warm_skipsets()
        assert keras.distribution.distribution() is dist
        for obj_type in internals._SKIPSET_TYPES:
            cached = global_state.get_global_attribute(f"saving_attr_skiplist_{obj_type}", None)
            assert cached is not None, obj_type
            assert saving_lib.get_attr_skipset(obj_type) is cached  # read from the cache: nothing is created
    finally:
        keras.distribution.set_distribution(None)
