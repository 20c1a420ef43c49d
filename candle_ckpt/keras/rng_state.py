"""The global random-number states a data pipeline may draw from, saved and restored.

Like Hugging Face Accelerate's ``save_state``: Python's ``random``, NumPy's
legacy global ``np.random``, TensorFlow's global generator and the op-seed
counter of its eager context, and Keras's global ``SeedGenerator``. With them
in the checkpoint, a ``PyDataset`` or generator that reshuffles with any of
these continues with the numbers the uninterrupted run would have drawn.

Two of them are private TensorFlow state: the global generator, reached through
:mod:`candle_ckpt.distributed.tf_internals` (the tf_keras adapter saves it too;
asking the public ``tf.random.get_global_generator()`` would create one and
change nothing else), and the op-seed counter, the ``random.Random`` that the
eager context draws op seeds from after ``tf.random.set_seed``, reached through
:mod:`candle_ckpt.keras.internals`.

The active backend's own global generator is here too (:func:`backend_capture`,
:func:`backend_restore`):

* **torch**: ``torch.get_rng_state()`` (CPU) and, when CUDA is available,
  ``torch.cuda.get_rng_state_all()`` (one state per device). Keras's torch
  backend draws from them for an unseeded ``Dropout`` (it calls
  ``torch.nn.functional.dropout``) and for ``fit``'s default ``shuffle=True``
  on NumPy inputs (a ``torch.utils.data.RandomSampler`` seeds itself from the
  CPU generator at the start of every epoch).
* **jax**: nothing. JAX has no global generator; Keras draws every random
  number from ``SeedGenerator`` variables, which travel with the model
  (``model.extra.npz``).
* **tensorflow**: nothing beyond the global generator and op-seed counter above.

The torch keys start with ``rng.torch.``, so they share one ``.npz`` with the
other states. Capture copies (a few KB); it never draws a number, so saving
does not change the run.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from candle_ckpt.distributed.tf_internals import tf_global_generator
from candle_ckpt.engine.state_file import capture_generator, capture_rng, restore_generator, restore_rng
from candle_ckpt.keras import internals

# The JSON document is {"python": ..., "numpy": ..., "tf_global": ..., "tf_op_seed": ..., "keras": ...};
# arrays go in the npz under these names.
_KERAS_KEY = "rng.keras.state"
TORCH_PREFIX = "rng.torch."
TORCH_CPU_KEY = TORCH_PREFIX + "cpu"
TORCH_CUDA_KEY = TORCH_PREFIX + "cuda.{}"


def _tf_loaded() -> bool:
    """True once TensorFlow is imported (the TF backend, tf.data): only then do its RNG states matter."""
    return "tensorflow" in sys.modules


def capture() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return (JSON-able document, arrays) of every global RNG state that exists now."""
    doc, arrays = capture_rng()  # Python's random and NumPy's
    if _tf_loaded():  # TensorFlow's states exist only once it is imported (never on a JAX/torch job without it)
        rng = internals.tf_op_seed_rng()
        if isinstance(rng, random.Random):
            v, s, g = rng.getstate()
            doc["tf_op_seed"] = [v, list(s), g]
        capture_generator(tf_global_generator(), doc, arrays)
    kgen = internals.keras_global_seed_generator(create=False)
    if kgen is not None:
        doc["keras"] = True
        arrays[_KERAS_KEY] = np.array(kgen.state.numpy(), copy=True)
    arrays.update(backend_capture())  # torch's global generators (nothing on JAX / TensorFlow)
    return doc, arrays


def restore(doc: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[str]:
    """Set every global RNG state saved by :func:`capture`; return the names of those set."""
    done = []
    if doc.get("keras") and _KERAS_KEY in arrays:
        # Creating Keras's global generator draws from Python's random: do it first.
        internals.keras_global_seed_generator(create=True).state.assign(arrays[_KERAS_KEY])
        done.append("keras")
    if _tf_loaded():
        import tensorflow as tf

        done += restore_generator(tf.random.get_global_generator, doc, arrays)
    if "tf_op_seed" in doc and _tf_loaded():
        rng = internals.tf_op_seed_rng()
        if isinstance(rng, random.Random):
            v, s, g = doc["tf_op_seed"]
            rng.setstate((v, tuple(s), g))
            done.append("tf_op_seed")
    done += restore_rng(doc, arrays)
    done += backend_restore(arrays)
    return done


def active_backend() -> str:
    """The Keras backend in use: ``keras.backend.backend()`` if Keras is loaded, else ``$KERAS_BACKEND``."""
    keras = sys.modules.get("keras")
    if keras is not None:
        return keras.backend.backend()
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def backend_capture(backend: str | None = None) -> dict[str, np.ndarray]:
    """Return the backend's global RNG states as owned uint8 arrays (empty for jax and tensorflow).

    Args:
        backend: ``"torch"``, ``"jax"`` or ``"tensorflow"``; default: the active Keras backend.
    """
    if (backend or active_backend()) != "torch":
        return {}
    import torch

    states = {TORCH_CPU_KEY: torch.get_rng_state().numpy().copy()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            states[TORCH_CUDA_KEY.format(i)] = state.numpy().copy()
    return states


def backend_restore(arrays: Mapping[str, np.ndarray], backend: str | None = None) -> list[str]:
    """Set the backend's global RNG states saved by :func:`backend_capture`; return the names of those set.

    Keys that do not start with ``rng.torch.`` are ignored. A checkpoint saved
    under another backend holds no torch state: then nothing is set, and the
    torch generator keeps its seed (a resume across backends is not
    bit-identical in its random draws anyway).

    Raises:
        ValueError: a saved CUDA state exists for more devices than this
            process sees, or a state is not a 1-D uint8 array.
    """
    mine = {k: np.asarray(v) for k, v in arrays.items() if k.startswith(TORCH_PREFIX)}
    if (backend or active_backend()) != "torch" or not mine:
        return []
    import torch

    for key, value in mine.items():
        if value.dtype != np.uint8 or value.ndim != 1:
            raise ValueError(f"{key}: a torch RNG state is a 1-D uint8 array; got {value.dtype} {value.shape}")
    done = []
    if TORCH_CPU_KEY in mine:
        torch.set_rng_state(torch.from_numpy(mine[TORCH_CPU_KEY].copy()))
        done.append("torch_cpu")
    cuda = sorted((int(k.rsplit(".", 1)[1]), v) for k, v in mine.items() if k.startswith(TORCH_PREFIX + "cuda."))
    if cuda:
        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if len(cuda) > seen:
            raise ValueError(
                f"{TORCH_CUDA_KEY.format('N')}: the checkpoint holds CUDA RNG states of {len(cuda)} devices but this "
                f"process sees {seen}; run on as many devices (CUDA_VISIBLE_DEVICES) to resume exactly"
            )
        if len(cuda) < seen:
            warnings.warn(
                f"the checkpoint holds CUDA RNG states of {len(cuda)} devices and this process sees {seen}: "
                "the others keep their seed, so random draws on them differ from the uninterrupted run",
                stacklevel=2,
            )
        for index, value in cuda:
            torch.cuda.set_rng_state(torch.from_numpy(value.copy()), index)
        done.append("torch_cuda")
    return done
