"""candle_ckpt: crash-safe, CANDLE-compatible checkpoint/restart for Keras 3.

Layers, each a subpackage, with imports pointing one way (see docs/architecture.rst):
``cli``/``keras``/``tf_keras``/``distributed`` (adapters) -> ``engine`` -> ``storage``
-> ``core``, with ``config`` beside ``core``. Only the adapters import keras or
tensorflow; they
(``CandleCheckpointCallback``, ``restart``, ``JobRunner``, ``load_weights``,
``WorkerTrainingState``) are imported lazily on first use. With
``TF_USE_LEGACY_KERAS=1`` (tf.keras is tf_keras), ``CandleCheckpointCallback``
is the tf_keras one (:mod:`candle_ckpt.tf_keras.adapter`); ``restart`` serves both
kinds of model.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.config.candle_params import ModelType, ParamRequired, ParamType, param
from candle_ckpt.config.cli_args import ckpt_defs, ckpt_parser, str2bool
from candle_ckpt.core.errors import (
    CheckpointError,
    CheckpointSaveError,
    CheckpointUploadError,
    CorruptCheckpoint,
    DirectoryLocked,
    GroupTimeout,
    LayoutMismatch,
    ModelMismatch,
    NoValidCheckpoint,
)

__version__ = "0.1.0"

_LAZY = {
    "CandleCheckpointCallback": "candle_ckpt.keras.callback",
    "restart": "candle_ckpt.keras.restart",
    "JobRunner": "candle_ckpt.keras.runner",
    "load_weights": "candle_ckpt.keras.partial",
    "WorkerTrainingState": "candle_ckpt.adapters",
    "CandleCkptKeras": "candle_ckpt.keras.candle_api",
    "CandleCkpt": "candle_ckpt.keras.candle_api",
    "MultiGPUCheckpoint": "candle_ckpt.keras.candle_api",
}

#: The names a CANDLE script takes from ``candle`` for checkpointing (see docs/migrating.rst).
CANDLE_NAMES = (
    "CandleCheckpointCallback",
    "CandleCkpt",
    "CandleCkptKeras",
    "ModelType",
    "MultiGPUCheckpoint",
    "ParamRequired",
    "ParamType",
    "restart",
)

# What users use: the CANDLE names, restart, the callbacks, JobRunner, WorkerTrainingState,
# load_weights, CANDLE's parameter helpers and the errors. The store and the frozen config
# are internals (candle_ckpt.storage.store.CheckpointStore, candle_ckpt.config.params.CkptConfig).
__all__ = [
    "CANDLE_NAMES",
    "CandleCheckpointCallback",
    "CandleCkpt",
    "CandleCkptKeras",
    "CheckpointError",
    "CheckpointSaveError",
    "CheckpointUploadError",
    "CorruptCheckpoint",
    "DirectoryLocked",
    "GroupTimeout",
    "JobRunner",
    "LayoutMismatch",
    "ModelMismatch",
    "ModelType",
    "MultiGPUCheckpoint",
    "NoValidCheckpoint",
    "ParamRequired",
    "ParamType",
    "WorkerTrainingState",
    "ckpt_defs",
    "ckpt_parser",
    "load_weights",
    "param",
    "restart",
    "str2bool",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        import os

        module = _LAZY[name]
        if name == "CandleCheckpointCallback" and os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true"):
            # The same switch that makes tf.keras mean tf_keras (Keras 2).
            module = "candle_ckpt.tf_keras.adapter"
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'candle_ckpt' has no attribute {name!r}")
