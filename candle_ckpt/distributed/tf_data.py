"""A ``tf.data`` iterator's position as arrays of a checkpoint's ``train.state.npz``, and back.

TensorFlow writes an iterator's state only through ``tf.train.Checkpoint`` to files: these go through a temporary
directory, each file's bytes one uint8 array named :data:`ITER_PREFIX` + its name. TensorFlow is imported lazily.
Used by the Keras 3 adapter for ``fit``'s kept iterator (``steps_per_epoch``; :mod:`candle_ckpt.keras.pipeline_state`).
"""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Any

import numpy as np

ITER_PREFIX = "pipe.iterator."


def iterator_bytes(iterator: Any) -> dict[str, np.ndarray]:
    """The arrays that hold ``iterator``'s position."""
    import tensorflow as tf  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="candle-ckpt-it-") as tmp:
        tf.train.Checkpoint(iterator=iterator).write(os.path.join(tmp, "it"))
        return {
            ITER_PREFIX + os.path.basename(p): np.frombuffer(open(p, "rb").read(), np.uint8)  # noqa: SIM115
            for p in glob.glob(os.path.join(tmp, "it*"))
        }


def load_iterator(iterator: Any, arrays: dict[str, np.ndarray]) -> None:
    """Put ``iterator`` where :func:`iterator_bytes` found its like (other keys of ``arrays`` are ignored).

    Raises:
        Exception: TensorFlow's, when the arrays are not a position of this pipeline's iterator.
    """
    import tensorflow as tf  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="candle-ckpt-it-") as tmp:
        for key, data in arrays.items():
            if key.startswith(ITER_PREFIX):
                with open(os.path.join(tmp, key[len(ITER_PREFIX) :]), "wb") as f:
                    f.write(np.asarray(data, np.uint8).tobytes())
        tf.train.Checkpoint(iterator=iterator).read(os.path.join(tmp, "it")).assert_consumed()
