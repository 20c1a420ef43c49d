"""Load a ``model.h5`` that ECP-CANDLE itself wrote (``model.save("model.h5")``, Keras's HDF5 format).

The weights are read by Keras's own HDF5 loader. The optimizer state is read
too when Keras can map it onto the model's optimizer: the file was written by
Keras 3 (Keras 2's optimizers name and order their variables differently) and
it holds ``optimizer_weights``. Otherwise the weights are loaded and a warning
says that the optimizer starts fresh. Optimizer variables of another number or
shape than the model's optimizer are a :class:`~candle_ckpt.core.errors.ModelMismatch`,
as for our own checkpoints (checked before anything is loaded).

CANDLE's scripts call ``restart()`` before ``model.compile()``: the model has
no optimizer yet. The values then wait for ``fit`` in the restore's
:class:`~candle_ckpt.engine.pending.Pending`, like those of our own checkpoints.
"""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from candle_ckpt.core.errors import ModelMismatch
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.mismatch import WHAT_TO_DO
from candle_ckpt.keras.preflight import check_optimizer_state
from candle_ckpt.keras.state import ModelState


def restore_candle_h5(model: Any, path: str, log: OpsLog, where: str) -> list[np.ndarray] | None:
    """Load CANDLE's ``model.h5`` at ``path`` into ``model``: the weights, and the optimizer state if it can.

    Returns:
        The optimizer variables when the model has no optimizer yet (not
        compiled): they wait for ``fit`` (:class:`~candle_ckpt.engine.pending.Pending`).
        None otherwise (loaded, or a warning said the optimizer starts fresh).

    Raises:
        ModelMismatch: the file's weights or optimizer variables do not fit the model (nothing was loaded).
    """
    values, why = _read_optimizer(path)
    compiled = getattr(model, "optimizer", None) is not None
    variables = check_optimizer_state(model, values, where) if values is not None and compiled else None
    _load_weights(model, path, where)
    if ModelState(model).extra_variables():
        log.warning(
            f"restart: {where} (written by CANDLE) holds no random-layer seed states; they start fresh, "
            "so the resumed run will not be bit-identical"
        )
    if values is None:
        _fresh(log, where, why)
        return None
    if variables is None:
        return values
    for var, value in zip(variables, values, strict=True):
        var.assign(value.astype(var.dtype, copy=False))
    log.info(f"restart: {where} (written by CANDLE): optimizer state loaded ({len(values)} variables)")
    return None


def _load_weights(model: Any, path: str, where: str) -> None:
    """Keras's own HDF5 loader, all or nothing: on a mismatch the weights it assigned are put back.

    Raises:
        ModelMismatch: the file's weights do not fit the model (with Keras's reason).
    """
    before = model.get_weights()
    try:
        model.load_weights(path)
    except ValueError as err:
        model.set_weights(before)
        raise ModelMismatch(
            f"checkpoint {where} (written by CANDLE) does not match the model: {err}\n{WHAT_TO_DO}"
        ) from err


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


def _fresh(log: OpsLog, where: str, why: str) -> None:
    log.warning(
        f"restart: {os.path.join(where, 'model.h5')} (written by CANDLE): the weights were loaded but {why}: "
        "the optimizer starts fresh (step 0, zero moments), so the resumed run will not match an "
        "uninterrupted one. The next checkpoint is written in candle_ckpt's format, which keeps it."
    )
