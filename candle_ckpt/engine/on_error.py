"""``ckpt_on_error``: what a failed save or drain does, for every save of the engine.

Each failure is kept (the engine's ``errors``, in ``stats()`` and the report) and said in ``ckpt.log``; with
``raise`` it then raises :class:`~candle_ckpt.core.errors.CheckpointSaveError` (or
:class:`~candle_ckpt.core.errors.CheckpointUploadError`) on the training thread, with ``warn`` training goes on.
An interruption (Ctrl-C, an exit) during a save is no failure: it is noted and raised again, never swallowed.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.core.errors import CheckpointSaveError, CheckpointUploadError
from candle_ckpt.core.log import OpsLog


def save_failed(setting: str, log: OpsLog, errors: list[str], epoch: int, err: BaseException, root: str) -> None:
    """The save of ``epoch`` failed with ``err`` (``root``: the checkpoint directory, named in the error)."""
    if not isinstance(err, Exception):  # Ctrl-C or an exit during the save: not a failure, never swallowed
        log.note(f"epoch {epoch}: checkpoint save interrupted ({type(err).__name__}); nothing of it is kept")
        raise err
    msg = f"epoch {epoch}: checkpoint save failed: {type(err).__name__}: {err}"
    errors.append(msg)
    if setting == "raise":
        log.error(msg + " (ckpt_on_error=raise: stopping)")
        raise CheckpointSaveError(msg + f"; earlier checkpoints in {root} are intact") from err
    log.warning(msg + " (ckpt_on_error=warn: training continues; earlier checkpoints are intact)")


def upload_failed(setting: str, log: OpsLog, errors: list[str], err: Exception) -> None:
    """A drain to the persistent tier failed with ``err``."""
    msg = f"checkpoint upload failed: {err}"
    errors.append(msg)
    if setting == "raise":
        log.error(msg + " (ckpt_on_error=raise: stopping)")
        raise CheckpointUploadError(msg + "; local checkpoints are intact") from err
    log.warning(msg + " (ckpt_on_error=warn: training continues; local checkpoints are intact)")


def failed_at_exit(log: OpsLog, errors: list[str], epoch: Any, cause: BaseException) -> None:
    """The last asynchronous write failed while the process exits: kept and logged, loudly (nothing to raise to)."""
    msg = f"epoch {epoch}: checkpoint save failed at exit: {type(cause).__name__}: {cause}"
    errors.append(msg)
    log.error(msg + "; earlier checkpoints are intact")


__all__ = ["failed_at_exit", "save_failed", "upload_failed"]
