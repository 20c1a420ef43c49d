"""Batches an input pipeline holds across an epoch boundary, kept in ``train.state.npz``.

Keras 3's ``PyDataset`` with ``workers > 1`` (or ``use_multiprocessing``) feeds ``fit`` through an
``OrderedEnqueuer`` that fetches an epoch's batches ahead. When the epoch ends, the batches it fetched but
``fit`` did not take stay queued, and the next epoch takes them first (on JAX and torch, whose ``fit`` reads one
batch ahead of training to build the model: from then on each epoch takes the batches fetched for the one
before). A resumed process holds other batches there, those of its own first read, so its first epoch would
train on them. The checkpoint therefore keeps the queued batches (the epoch's beginning for a step checkpoint,
the next epoch's for an epoch checkpoint), and a resumed run puts them back in the queue.

A batch is what ``PyDataset.__getitem__`` returned: arrays, or tuples, lists and dicts (string keys) of them.
Every leaf becomes one NumPy array (a framework tensor through ``numpy.asarray``); a leaf that is not an array of
numbers, booleans or strings, or batches larger than :data:`MAX_BYTES` in all, are not kept: :func:`capture`
says why in one warning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: The most bytes of queued batches a checkpoint keeps (a ``max_queue_size`` of 10 image batches can pass it).
MAX_BYTES = 256 << 20
PREFIX = "pipe.carried."
_KINDS = "biufcSU"


class _NotKept(ValueError):
    """The queued batches cannot be kept (the message says why)."""


def encode(batches: Sequence[Any], prefix: str = PREFIX) -> tuple[list[Any], dict[str, np.ndarray]]:
    """``(structure, arrays)`` for ``batches``: the structure is JSON (each leaf ``{"array": key}``), the arrays
    are copies keyed ``prefix + n``.

    Raises:
        _NotKept: a leaf is not an array of plain values, or the arrays pass :data:`MAX_BYTES`.
    """
    arrays: dict[str, np.ndarray] = {}
    total = 0

    def walk(value: Any) -> Any:
        nonlocal total
        if value is None:
            return None
        if isinstance(value, tuple | list):
            return {"tuple" if isinstance(value, tuple) else "list": [walk(v) for v in value]}
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise _NotKept("a batch is a dict with keys that are not strings")
            return {"dict": {k: walk(v) for k, v in value.items()}}
        try:
            array = np.array(value, copy=True)
        except Exception as err:  # an object numpy cannot read
            raise _NotKept(f"a batch holds a {type(value).__name__} ({type(err).__name__})") from err
        if array.dtype.kind not in _KINDS:
            raise _NotKept(f"a batch holds a {type(value).__name__} of {array.dtype} values")
        total += array.nbytes
        if total > MAX_BYTES:
            raise _NotKept(f"they pass {MAX_BYTES >> 20} MiB")
        key = f"{prefix}{len(arrays)}"
        arrays[key] = array
        return {"array": key}

    return [walk(batch) for batch in batches], arrays


def capture(batches: Sequence[Any], warn: Callable[[str], None]) -> tuple[list[Any] | None, dict[str, np.ndarray]]:
    """:func:`encode` of ``batches``, or ``(None, {})`` after saying why they cannot be kept."""
    try:
        return encode(batches)
    except _NotKept as why:
        warn(
            "the batches the PyDataset's workers fetched ahead for the next epoch are not saved "
            f"({why}): a resumed run's first epoch trains on others and will not be bit-identical; lower "
            "max_queue_size, or use workers=1 for an exact resume"
        )
        return None, {}


def decode(structure: Sequence[Any], arrays: dict[str, np.ndarray]) -> list[Any]:
    """The batches :func:`encode` described, their leaves NumPy arrays."""

    def walk(node: Any) -> Any:
        if node is None:
            return None
        if "array" in node:
            return np.asarray(arrays[node["array"]])
        if "dict" in node:
            return {k: walk(v) for k, v in node["dict"].items()}
        items = [walk(v) for v in node.get("tuple", node.get("list", []))]
        return tuple(items) if "tuple" in node else items

    return [walk(node) for node in structure]


__all__ = ["MAX_BYTES", "PREFIX", "capture", "decode", "encode"]
