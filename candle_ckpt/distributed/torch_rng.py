"""torch's global RNG states (CPU, and each CUDA device drawn from) as arrays of ``train.state.npz`` and back.

The Keras 3 adapter saves them with the other global RNGs (:func:`candle_ckpt.keras.pipeline_state.capture_rngs`)
on every backend once torch is imported: the torch backend draws from them, and so does a torch ``DataLoader``'s
shuffle feeding ``fit`` on JAX or TensorFlow. Outside keras/ as TensorFlow's global generator is
(:mod:`candle_ckpt.distributed.tf_internals`): a framework's state, not Keras's.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping

import numpy as np

TORCH_PREFIX = "rng.torch."
TORCH_CPU_KEY = TORCH_PREFIX + "cpu"
TORCH_CUDA_KEY = TORCH_PREFIX + "cuda.{}"


def _torch_draws(backend: str | None) -> bool:
    """Whether torch's global generators are in play: torch is imported (the torch backend, or a ``DataLoader``
    on another), or ``backend`` says torch."""
    return backend == "torch" or "torch" in sys.modules


def backend_capture(backend: str | None = None) -> dict[str, np.ndarray]:
    """Return torch's global RNG states as owned uint8 arrays (empty unless :func:`_torch_draws`: torch imported,
    or ``backend`` ``"torch"``)."""
    if not _torch_draws(backend):
        return {}
    import torch

    states = {TORCH_CPU_KEY: torch.get_rng_state().numpy().copy()}
    if torch.cuda.is_initialized():  # else nothing drew from them: not initialized here (a context on every GPU)
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            states[TORCH_CUDA_KEY.format(i)] = state.numpy().copy()
    return states


def backend_restore(arrays: Mapping[str, np.ndarray], backend: str | None = None) -> list[str]:
    """Set the backend's global RNG states saved by :func:`backend_capture`; return the names of those set.

    Keys that do not start with ``rng.torch.`` are ignored; nothing is set unless :func:`_torch_draws`. A
    checkpoint saved without torch holds no torch state: then nothing is set, and the torch generator keeps its
    seed (a resume across backends is not bit-identical in its random draws anyway).

    Raises:
        ValueError: a saved CUDA state exists for more devices than this process sees, or a state is not a 1-D
            uint8 array.
    """
    mine = {k: np.asarray(v) for k, v in arrays.items() if k.startswith(TORCH_PREFIX)}
    if not (mine and _torch_draws(backend)):
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
