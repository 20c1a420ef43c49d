"""candle_ckpt: crash-safe, CANDLE-compatible checkpoint/restart for Keras 3.

The core (layout, durable, checksum, sidecar, policy, params, store, writer,
engine) imports neither keras nor tensorflow; the Keras adapters
(``CandleCheckpointCallback``, ``restart``, ``JobRunner``, ``load_weights``)
are imported lazily on first use.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.engine import CheckpointSaveError
from candle_ckpt.params import CkptConfig, ckpt_defs, ckpt_parser, str2bool
from candle_ckpt.store import CheckpointError, CheckpointStore, CorruptCheckpoint, DirectoryLocked, NoValidCheckpoint

__version__ = "0.1.0"

_LAZY = {
    "CandleCheckpointCallback": "candle_ckpt.callback",
    "restart": "candle_ckpt.keras_restart",
    "JobRunner": "candle_ckpt.runner",
    "load_weights": "candle_ckpt.partial",
}

__all__ = [
    "CandleCheckpointCallback",
    "CheckpointError",
    "CheckpointSaveError",
    "CheckpointStore",
    "CkptConfig",
    "CorruptCheckpoint",
    "DirectoryLocked",
    "JobRunner",
    "NoValidCheckpoint",
    "ckpt_defs",
    "ckpt_parser",
    "load_weights",
    "restart",
    "str2bool",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'candle_ckpt' has no attribute {name!r}")
