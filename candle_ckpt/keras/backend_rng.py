"""The active Keras backend's own global RNG state, as arrays to save with a checkpoint.

Keras's ``SeedGenerator`` state travels with the model (``model.extra.npz``),
and Python's, NumPy's and TensorFlow's global states are the job of
:mod:`candle_ckpt.keras.rng_state` (issue 11). What remains is the global
generator of the backend itself:

* **torch**: ``torch.get_rng_state()`` (CPU) and, when CUDA is available,
  ``torch.cuda.get_rng_state_all()`` (one state per device). Keras's torch
  backend draws from them for an unseeded ``Dropout`` (it calls
  ``torch.nn.functional.dropout``) and for ``fit``'s default ``shuffle=True``
  on NumPy inputs (a ``torch.utils.data.RandomSampler`` seeds itself from the
  CPU generator at the start of every epoch).
* **jax**: nothing. JAX has no global generator; Keras draws every random
  number from ``SeedGenerator`` variables, which travel with the model.
* **tensorflow**: nothing here; TensorFlow's global generator and op-seed
  counter are in :mod:`candle_ckpt.keras.rng_state`.

To plug this in, merge its arrays into the RNG part of the checkpoint::

    arrays.update(backend_rng.capture())      # at save, on the training thread
    restored += backend_rng.restore(arrays)   # at restart, keys it does not know are ignored

The keys start with ``rng.torch.``, so they can share one ``.npz`` with other
states. Capture copies (a few KB); it never draws a number, so saving does not
change the run.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import numpy as np

PREFIX = "rng.torch."
CPU_KEY = PREFIX + "cpu"
CUDA_KEY = PREFIX + "cuda.{}"


def active_backend() -> str:
    """The Keras backend in use: ``keras.backend.backend()`` if Keras is loaded, else ``$KERAS_BACKEND``."""
    import sys

    keras = sys.modules.get("keras")
    if keras is not None:
        return keras.backend.backend()
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def capture(backend: str | None = None) -> dict[str, np.ndarray]:
    """Return the backend's global RNG states as owned uint8 arrays (empty for jax and tensorflow).

    Args:
        backend: ``"torch"``, ``"jax"`` or ``"tensorflow"``; default: the active Keras backend.
    """
    if (backend or active_backend()) != "torch":
        return {}
    import torch

    states = {CPU_KEY: torch.get_rng_state().numpy().copy()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            states[CUDA_KEY.format(i)] = state.numpy().copy()
    return states


def restore(arrays: Mapping[str, np.ndarray], backend: str | None = None) -> list[str]:
    """Set the backend's global RNG states saved by :func:`capture`; return the names of those set.

    Keys that do not start with ``rng.torch.`` are ignored. A checkpoint saved
    under another backend holds no torch state: then nothing is set, and the
    torch generator keeps its seed (a resume across backends is not
    bit-identical in its random draws anyway).

    Raises:
        ValueError: a saved CUDA state exists for more devices than this
            process sees, or a state is not a 1-D uint8 array.
    """
    mine = {k: np.asarray(v) for k, v in arrays.items() if k.startswith(PREFIX)}
    if (backend or active_backend()) != "torch" or not mine:
        return []
    import torch

    for key, value in mine.items():
        if value.dtype != np.uint8 or value.ndim != 1:
            raise ValueError(f"{key}: a torch RNG state is a 1-D uint8 array; got {value.dtype} {value.shape}")
    done = []
    if CPU_KEY in mine:
        torch.set_rng_state(torch.from_numpy(mine[CPU_KEY].copy()))
        done.append("torch_cpu")
    cuda = sorted((int(k.rsplit(".", 1)[1]), v) for k, v in mine.items() if k.startswith(PREFIX + "cuda."))
    if cuda:
        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if len(cuda) > seen:
            raise ValueError(
                f"{CUDA_KEY.format('N')}: the checkpoint holds CUDA RNG states of {len(cuda)} devices but this "
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
