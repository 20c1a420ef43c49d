"""A tf_keras optimizer's state: its variables, building them, and assigning saved values all or nothing.

Legacy H5 weights do not hold the optimizer, so a tf_keras checkpoint keeps
its variables by position in ``optimizer.npz``
(:class:`~candle_ckpt.tf_keras.adapter.TfKerasModelAdapter`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

import candle_ckpt.tf_keras.internals as internals


def optimizer_variables(model) -> list[Any]:
    """The variables of ``model``'s optimizer, in order (none without an optimizer)."""
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return []
    variables = opt.variables
    return list(variables() if callable(variables) else variables)  # legacy optimizers: a method


def build_optimizer(model) -> None:
    """Create the optimizer's variables (in the model's strategy scope) so they can be assigned."""
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return
    strategy = getattr(model, "distribute_strategy", None)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        internals.build_optimizer_variables(opt, model.trainable_variables)


def check_optimizer_state(variables: list[Any], names: list[str], values: list[np.ndarray], where: str) -> None:
    """Raise ValueError unless the saved optimizer state fits ``variables`` (checked before any assignment)."""
    if len(names) != len(variables):
        raise ValueError(
            f"{where} holds {len(names)} optimizer variables but the model's optimizer "
            f"has {len(variables)} (a different optimizer?); the model was not changed"
        )
    for name, value, var in zip(names, values, variables, strict=True):
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(
                f"optimizer variable {var.name}: checkpoint shape {value.shape} (saved as {name}) "
                f"!= model shape {tuple(var.shape)}; the model was not changed"
            )


def assign_optimizer_state(model, names: list[str], values: list[np.ndarray], where: str) -> None:
    """Build ``model``'s optimizer, check the saved state fits, then assign it (all or nothing)."""
    build_optimizer(model)
    variables = optimizer_variables(model)
    check_optimizer_state(variables, names, values, where)
    for value, var in zip(values, variables, strict=True):
        var.assign(value)
