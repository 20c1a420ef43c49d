"""Which saved dtypes load into a variable of another dtype unchanged (checkpoints cross backends).

One rule, used by every restore path (a ``.keras`` archive's preflight, a
sharded restore, ``candle-ckpt consolidate``): the same dtype, or integers of
another width whose values all fit. A step counter is int32 under JAX and
int64 under TensorFlow (Adam's ``iteration``), so a checkpoint written under
one backend restores under the other; a large integer array of another width
is a different model, and refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

COUNTER_MAX_VALUES = 1024  # an integer value of another width is taken only up to this many elements


def counter_fits(saved: str, model: str, size: int, values: Callable[[], np.ndarray]) -> bool:
    """True if a value saved as ``saved`` (``size`` elements, read by ``values()``) loads into ``model`` unchanged.

    ``values`` is called only when the dtypes are integers of different widths (small values: counters).
    """
    if saved == model:
        return True
    try:
        if not (np.issubdtype(np.dtype(saved), np.integer) and np.issubdtype(np.dtype(model), np.integer)):
            return False
    except TypeError:  # a dtype NumPy does not know (bfloat16): only the same dtype fits
        return False
    if size > COUNTER_MAX_VALUES:
        return False
    data = np.asarray(values())
    info = np.iinfo(np.dtype(model))
    return data.size == 0 or (int(data.min()) >= info.min and int(data.max()) <= info.max)
