"""The random generators of a tf_keras model's random layers, saved and put back (``random_layers.npz``).

Under ``tf_keras.backend.experimental.enable_tf_random_generator()``, each
random layer (``Dropout``, ``GaussianNoise``, ...) draws from a
``tf.random.Generator`` of its own, whose state is a variable that is not one
of the model's weights. A checkpoint keeps each state by position, with the
layer's name; a restore checks every one before assigning any, so a resumed
run draws the numbers the uninterrupted one would have drawn.

By default tf_keras's random layers draw from TF1 stateful kernels instead,
whose state cannot be read or set: :mod:`candle_ckpt.tf_keras.exactness` says
so once, with the remedy.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

import candle_ckpt.tf_keras.internals as internals
from candle_ckpt.core.errors import ModelMismatch

RANDOM_FILE = "random_layers.npz"


def _generators(model: Any) -> list[tuple[str, Any]]:
    return [(name, gen) for name, kind, gen in internals.random_generators(model) if gen is not None]


def capture(model: Any) -> bytes | None:
    """The states of the model's layer generators as ``.npz`` bytes, or None if it has none."""
    gens = _generators(model)
    if not gens:
        return None
    buf = io.BytesIO()
    states = {f"s{i}": np.array(gen.state.numpy(), copy=True) for i, (_, gen) in enumerate(gens)}
    np.savez(buf, names=np.array([name for name, _ in gens], dtype=str), **states)
    return buf.getvalue()


def check(model: Any, data: bytes | None, where: str) -> list[tuple[Any, np.ndarray]]:
    """What :func:`assign` sets: each generator with its saved state; raise :class:`ModelMismatch` if they differ.

    ``data`` None (a checkpoint without the file): nothing to set (see :func:`unsaved`).
    """
    gens = _generators(model)
    if data is None:
        return []
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        names = [str(n) for n in npz["names"]]
        states = [npz[f"s{i}"] for i in range(len(names))]
    if len(names) != len(gens):
        raise ModelMismatch(
            f"{where}/{RANDOM_FILE} holds {len(names)} random-layer generators ({', '.join(names)}) but the model "
            f"has {len(gens)} ({', '.join(n for n, _ in gens)}); the model was not changed"
        )
    for name, state, (layer, gen) in zip(names, states, gens, strict=True):
        if tuple(state.shape) != tuple(gen.state.shape):
            raise ModelMismatch(
                f"random layer {layer}: generator state of shape {tuple(gen.state.shape)} but {where}/{RANDOM_FILE} "
                f"saved {state.shape} (as {name}); the model was not changed"
            )
    return [(gen, state) for (_, gen), state in zip(gens, states, strict=True)]


def assign(checked: list[tuple[Any, np.ndarray]]) -> None:
    """Set the generator states :func:`check` returned."""
    for gen, state in checked:
        gen.state.assign(state)


def unsaved(model: Any, data: bytes | None, where: str) -> str | None:
    """The warning for a checkpoint without generator states restored into a model with generators, else None."""
    gens = _generators(model)
    if data is not None or not gens:
        return None
    return (
        f"{where} holds no {RANDOM_FILE}: the generators of the random layers {', '.join(n for n, _ in gens)} "
        "start from their seeds, so the resumed run draws other numbers than an uninterrupted one (the checkpoint "
        "was saved without enable_tf_random_generator()?)"
    )
