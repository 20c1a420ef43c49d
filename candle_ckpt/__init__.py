"""candle_ckpt: crash-safe, CANDLE-compatible checkpoint/restart for Keras 3.

Layers, each a subpackage, with imports pointing one way (see docs/architecture.rst):
``cli``/``keras``/``tf_keras``/``distributed`` (adapters) -> ``engine`` -> ``storage``
-> ``core``, with ``config`` beside ``core``. Only the adapters import keras or
tensorflow. Every public name (the adapters' ``CandleCheckpointCallback``,
``restart``, ``JobRunner``, ``load_weights``, ``WorkerTrainingState``; the
errors; CANDLE's parameter helpers) is imported on first use. With
``TF_USE_LEGACY_KERAS=1`` (tf.keras is tf_keras), ``CandleCheckpointCallback``
is the tf_keras one (:mod:`candle_ckpt.tf_keras.adapter`); ``restart`` serves both
kinds of model.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Every public name is imported on first use, so that ``import candle_ckpt`` costs almost nothing: the
# ``candle-ckpt`` command handles Ctrl-C from its entry module's first statement, which runs after this
# package's body (a literal dict and two functions: keep it so, no imports and no calls).
_LAZY = {
    "ModelType": "candle_ckpt.config.candle_params",
    "ParamRequired": "candle_ckpt.config.candle_params",
    "ParamType": "candle_ckpt.config.candle_params",
    "param": "candle_ckpt.config.candle_params",
    "ckpt_defs": "candle_ckpt.config.cli_args",
    "ckpt_parser": "candle_ckpt.config.cli_args",
    "str2bool": "candle_ckpt.config.cli_args",
    "CheckpointError": "candle_ckpt.core.errors",
    "CheckpointSaveError": "candle_ckpt.core.errors",
    "CheckpointUploadError": "candle_ckpt.core.errors",
    "LineageConflict": "candle_ckpt.core.errors",
    "CorruptCheckpoint": "candle_ckpt.core.errors",
    "DirectoryLocked": "candle_ckpt.core.errors",
    "GroupTimeout": "candle_ckpt.core.errors",
    "LayoutMismatch": "candle_ckpt.core.errors",
    "ModelMismatch": "candle_ckpt.core.errors",
    "NoValidCheckpoint": "candle_ckpt.core.errors",
    "CandleCheckpointCallback": "candle_ckpt.keras.callback",
    "restart": "candle_ckpt.adapters",
    "JobRunner": "candle_ckpt.runner.job",
    "load_weights": "candle_ckpt.keras.partial",
    "WorkerTrainingState": "candle_ckpt.adapters",
    "CandleCkptKeras": "candle_ckpt.compat.candle_api",
    "CandleCkpt": "candle_ckpt.compat.candle_api",
    "MultiGPUCheckpoint": "candle_ckpt.compat.candle_api",
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
    "LineageConflict",
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


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib
        import os

        from candle_ckpt.core.install import warn_if_overlaid

        warn_if_overlaid()  # keras and keras-nightly installed over each other: said once, at the first name used
        module = _LAZY[name]
        if name == "CandleCheckpointCallback" and os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true"):
            # The same switch that makes tf.keras mean tf_keras (Keras 2).
            module = "candle_ckpt.tf_keras.adapter"
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'candle_ckpt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
