"""``candle_ckpt.__all__`` holds what users use, and nothing of the internals."""

from __future__ import annotations

import candle_ckpt

USED = {
    # CANDLE's names (docs/migrating.rst) and its parameter helpers
    *candle_ckpt.CANDLE_NAMES,
    "CANDLE_NAMES",
    "ckpt_defs",
    "ckpt_parser",
    "param",
    "str2bool",
    # the rest of the API
    "JobRunner",
    "WorkerTrainingState",
    "load_weights",
    # the errors users catch (docs/api.rst, Errors)
    "CheckpointError",
    "CheckpointSaveError",
    "CheckpointUploadError",
    "LineageConflict",
    "CorruptCheckpoint",
    "DirectoryLocked",
    "GroupTimeout",
    "LayoutMismatch",
    "ModelMismatch",
    "NoValidCheckpoint",
}


def test_all_is_what_users_use_and_not_the_store_or_the_config() -> None:
    """__all__ is exactly the user-facing names: no CheckpointStore, no CkptConfig, and each eager one resolves."""
    assert set(candle_ckpt.__all__) == USED
    assert not {"CheckpointStore", "CkptConfig"} & set(dir(candle_ckpt))
    for name in USED - set(candle_ckpt._LAZY):
        assert getattr(candle_ckpt, name) is not None
