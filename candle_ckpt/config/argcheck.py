"""Argument checks shared by the CANDLE-named entry points: a clear TypeError, never an AttributeError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def require_model(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` looks like a Keras model (it has ``layers`` and ``built``).

    Args:
        value: What the caller passed as the model.
        where: The call and argument, e.g. ``"restart(gParameters, model): model"``.
    """
    if isinstance(value, Mapping):
        raise TypeError(
            f"{where} must be a Keras model; got a {type(value).__name__} (the parameter dict? "
            "it goes in the other argument: restart(gParameters, model), CandleCkptKeras(gParameters), "
            "ckpt.restart(model))"
        )
    if not (hasattr(value, "layers") and hasattr(value, "built")):
        raise TypeError(f"{where} must be a Keras model; got {type(value).__name__}")


def require_params(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` is a mapping (the ``gParameters`` dict)."""
    if isinstance(value, Mapping):
        return
    hint = " (a model? the parameter dict goes here, the model elsewhere)" if hasattr(value, "layers") else ""
    raise TypeError(f"{where} must be the parameter dict (a mapping); got {type(value).__name__}{hint}")
