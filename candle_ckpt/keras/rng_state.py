"""The global random-number states a data pipeline may draw from, saved and restored.

Like Hugging Face Accelerate's ``save_state``: Python's ``random``, NumPy's
legacy global ``np.random``, TensorFlow's global generator and the op-seed
counter of its eager context, and Keras's global ``SeedGenerator``. With them
in the checkpoint, a ``PyDataset`` or generator that reshuffles with any of
these continues with the numbers the uninterrupted run would have drawn.

Two of them are private TensorFlow state, reached through
:mod:`candle_ckpt.keras.internals`: the global generator (asking the public
``tf.random.get_global_generator()`` would create one and change nothing else),
and the op-seed counter, the ``random.Random`` that the eager context draws
op seeds from after ``tf.random.set_seed``.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np

from candle_ckpt.keras import backend_rng, internals

# The JSON document is {"python": ..., "numpy": ..., "tf_global": ..., "tf_op_seed": ..., "keras": ...};
# arrays go in the npz under these names.
_NP_KEY = "rng.numpy.keys"
_TF_KEY = "rng.tf_global.state"
_KERAS_KEY = "rng.keras.state"


def _tf_loaded() -> bool:
    """True once TensorFlow is imported (the TF backend, tf.data): only then do its RNG states matter."""
    return "tensorflow" in sys.modules


def capture() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return (JSON-able document, arrays) of every global RNG state that exists now."""
    version, internal, gauss = random.getstate()
    doc: dict[str, Any] = {"python": [version, list(internal), gauss]}
    arrays: dict[str, np.ndarray] = {}
    name, keys, pos, has_gauss, cached = np.random.get_state()
    doc["numpy"] = [name, int(pos), int(has_gauss), float(cached)]
    arrays[_NP_KEY] = np.array(keys, copy=True)
    if _tf_loaded():  # TensorFlow's states exist only once it is imported (never on a JAX/torch job without it)
        rng = internals.tf_op_seed_rng()
        if isinstance(rng, random.Random):
            v, s, g = rng.getstate()
            doc["tf_op_seed"] = [v, list(s), g]
        gen = internals.tf_global_generator()
        if gen is not None:
            doc["tf_global"] = {"algorithm": int(gen.algorithm)}
            arrays[_TF_KEY] = np.array(gen.state.numpy(), copy=True)
    kgen = internals.keras_global_seed_generator(create=False)
    if kgen is not None:
        doc["keras"] = True
        arrays[_KERAS_KEY] = np.array(kgen.state.numpy(), copy=True)
    arrays.update(backend_rng.capture())  # torch's global generators (nothing on JAX / TensorFlow)
    return doc, arrays


def restore(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
    """Set every global RNG state saved by :func:`capture`; return the names of those set."""
    done = []
    if doc.get("keras") and _KERAS_KEY in arrays:
        # Creating Keras's global generator draws from Python's random: do it first.
        internals.keras_global_seed_generator(create=True).state.assign(arrays[_KERAS_KEY])
        done.append("keras")
    if "tf_global" in doc and _TF_KEY in arrays and _tf_loaded():
        import tensorflow as tf

        gen = tf.random.get_global_generator()
        if int(gen.algorithm) == int(doc["tf_global"]["algorithm"]):
            gen.reset(arrays[_TF_KEY])
            done.append("tf_global")
    if "tf_op_seed" in doc and _tf_loaded():
        rng = internals.tf_op_seed_rng()
        if isinstance(rng, random.Random):
            v, s, g = doc["tf_op_seed"]
            rng.setstate((v, tuple(s), g))
            done.append("tf_op_seed")
    version, internal, gauss = doc["python"]
    random.setstate((version, tuple(internal), gauss))
    name, pos, has_gauss, cached = doc["numpy"]
    np.random.set_state((name, arrays[_NP_KEY], pos, has_gauss, cached))
    done += ["python", "numpy"]
    done += backend_rng.restore(arrays)
    return done
