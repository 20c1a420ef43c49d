"""Load a ``model.h5`` that ECP-CANDLE itself wrote (``model.save("model.h5")``, Keras's HDF5 format).

The weights are read by Keras's own HDF5 loader. The optimizer state is read
too when Keras can map it onto the model's optimizer: the file was written by
Keras 3 (Keras 2's optimizers name and order their variables differently),
it holds ``optimizer_weights``, and their number and shapes match. Otherwise
the weights are loaded and a warning says that the optimizer starts fresh.

CANDLE's scripts call ``restart()`` before ``model.compile()``: the model has
no optimizer yet. The values are then kept on the model (an explicit object,
not module state) and applied when training begins, by the checkpoint
callback (:func:`apply_pending`).
"""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from candle_ckpt.core.log import OpsLog
from candle_ckpt.keras.plan import build_optimizer
from candle_ckpt.keras.state import ModelState

PENDING = "_candle_ckpt_pending_h5_optimizer"  # attribute set on the model until its optimizer exists


def restore_candle_h5(model: Any, path: str, ops: OpsLog, where: str) -> list[np.ndarray] | None:
    """Load CANDLE's ``model.h5`` at ``path`` into ``model``: the weights, and the optimizer state if it can.

    Returns:
        The optimizer variables when the model has no optimizer yet (not
        compiled): the caller keeps them until it has one (:func:`keep_pending`).
        None otherwise (loaded, or a warning said the optimizer starts fresh).

    Raises:
        ValueError: the file's weights do not fit the model (Keras's message).
    """
    model.load_weights(path)
    if ModelState(model).extra_variables():
        ops.warning(
            f"restart: {where} (written by CANDLE) holds no random-layer seed states; they start fresh, "
            "so the resumed run will not be bit-identical"
        )
    values, why = _read_optimizer(path)
    if values is None:
        _fresh(ops, where, why)
        return None
    if getattr(model, "optimizer", None) is None:
        ops.info(
            f"restart: {where} (written by CANDLE): weights loaded; the model is not compiled yet, so its "
            f"optimizer state ({len(values)} variables) is applied when training begins"
        )
        return values
    _apply(model, values, ops, where)
    return None


def keep_pending(model: Any, values: list[np.ndarray], where: str) -> None:
    """Keep optimizer variables on ``model`` until :func:`apply_pending` (the callback, when fit begins)."""
    setattr(model, PENDING, (values, where))


def apply_pending(model: Any, ops: OpsLog) -> None:
    """Apply optimizer state that :func:`restore_candle_h5` kept for ``model`` (a no-op if there is none)."""
    pending = getattr(model, PENDING, None) if model is not None else None
    if pending is None:
        return
    delattr(model, PENDING)
    values, where = pending
    if getattr(model, "optimizer", None) is None:
        _fresh(ops, where, "the model was never compiled")
        return
    _apply(model, values, ops, where)


def _read_optimizer(path: str) -> tuple[list[np.ndarray] | None, str]:
    """The optimizer variables stored in ``path`` in saving order, or ``(None, why not)``."""
    with h5py.File(path, "r") as f:
        version = f.attrs.get("keras_version", b"")
        version = version.decode() if isinstance(version, bytes) else str(version)
        if "optimizer_weights" not in f:
            return None, "the file holds no optimizer state"
        if not version.startswith("3."):
            return None, (
                f"it was written by Keras {version or '(unknown version)'}, whose optimizer variables "
                "Keras 3 cannot map onto its own"
            )
        group = f["optimizer_weights"]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in group.attrs.get("weight_names", [])]
        return [np.asarray(group[name]) for name in names], ""


def _apply(model: Any, values: list[np.ndarray], ops: OpsLog, where: str) -> None:
    build_optimizer(model)
    variables = model.optimizer.variables
    saved = [tuple(v.shape) for v in values]
    wanted = [tuple(v.shape) for v in variables]
    if saved != wanted:
        _fresh(
            ops,
            where,
            f"its {len(saved)} optimizer variables do not match the {len(wanted)} of the model's "
            f"{type(model.optimizer).__name__} (shapes {saved[:4]}... vs {wanted[:4]}...)",
        )
        return
    for var, value in zip(variables, values, strict=True):
        var.assign(value.astype(var.dtype, copy=False))
    ops.info(f"restart: {where} (written by CANDLE): optimizer state loaded ({len(values)} variables)")


def _fresh(ops: OpsLog, where: str, why: str) -> None:
    ops.warning(
        f"restart: {os.path.join(where, 'model.h5')} (written by CANDLE): the weights were loaded but {why}: "
        "the optimizer starts fresh (step 0, zero moments), so the resumed run will not match an "
        "uninterrupted one. The next checkpoint is written in candle_ckpt's format, which keeps it."
    )
