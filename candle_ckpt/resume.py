"""Which checkpoint a restart loads: shared by ``restart()``, the tf_keras
adapter and :class:`~candle_ckpt.distributed.WorkerTrainingState`.

No keras, no tensorflow: the choice is made from the store alone, so the
chief of a multi-worker job can make it once and tell the other workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from candle_ckpt.oplog import OpsLog
from candle_ckpt.params import CkptConfig
from candle_ckpt.sidecar import Sidecar
from candle_ckpt.store import CheckpointError, CheckpointStore, NoValidCheckpoint


@dataclass(frozen=True)
class Chosen:
    """A verified checkpoint: its epoch, sidecar and the bytes of the files asked for."""

    epoch: int
    sidecar: Sidecar
    kept: dict[str, bytes]


def choose_checkpoint(cfg: CkptConfig, store: CheckpointStore, ops: OpsLog, keep: Iterable[str]) -> Chosen | None:
    """Apply ``ckpt_restart_mode`` / ``ckpt_restart_epoch`` to ``store``.

    Every file's CRC is verified; the bytes of the names in ``keep`` are
    returned so that they are read once.

    Returns:
        The checkpoint to load, or None (start from scratch).

    Raises:
        NoValidCheckpoint: ``required`` mode found nothing valid, or
            ``ckpt_restart_epoch`` names a missing or invalid checkpoint.
    """
    if cfg.restart_mode == "off":
        return None
    keep = tuple(keep)
    where = store.layout.root
    if not store.exists():
        if cfg.restart_mode == "required" or cfg.restart_epoch is not None:
            raise NoValidCheckpoint(f"ckpt_restart_mode={cfg.restart_mode}: no checkpoints in {where}")
        if os.path.isdir(where):  # logging would create the directory otherwise
            ops.info(f"restart: no checkpoints in {where}; starting from scratch")
        return None
    if cfg.restart_epoch is not None:
        if cfg.restart_epoch not in store.epochs():
            raise NoValidCheckpoint(
                f"ckpt_restart_epoch={cfg.restart_epoch}: no checkpoint {store.layout.epoch_dir(cfg.restart_epoch)}"
            )
        try:
            side, kept = store.verify(cfg.restart_epoch, keep=keep)
        except CheckpointError as err:
            raise NoValidCheckpoint(f"ckpt_restart_epoch={cfg.restart_epoch}: checkpoint is not valid: {err}") from None
        return Chosen(cfg.restart_epoch, side, kept)

    problems: list[str] = []

    def report(bad_epoch: int, why: str) -> None:
        problems.append(f"epoch {bad_epoch}: {why}")
        ops.warning(f"restart: skipping epoch {bad_epoch}: {why}")

    found = store.find_valid(keep=keep, on_problem=report)
    if found is None:
        detail = "; ".join(problems) or "none were found"
        if cfg.restart_mode == "required":
            raise NoValidCheckpoint(f"ckpt_restart_mode=required: no valid checkpoint in {where} ({detail})")
        if problems:
            ops.warning(f"restart: no valid checkpoint in {where} ({detail}); starting from scratch")
        else:  # an empty store (e.g. just created by this job's writer) is not a problem
            ops.info(f"restart: no checkpoints in {where}; starting from scratch")
        return None
    epoch, side, kept = found
    return Chosen(epoch, side, kept)


def verify_exact(store: CheckpointStore, epoch: int, generation: int, keep: Iterable[str]) -> Chosen:
    """Verify the checkpoint another process chose: exactly ``epoch`` at ``generation``.

    Raises:
        CorruptCheckpoint: a file fails its size or CRC check.
        NoValidCheckpoint: the directory holds another commit of that epoch.
    """
    side, kept = store.verify(epoch, keep=tuple(keep))
    if side.generation != generation:
        raise NoValidCheckpoint(
            f"{store.layout.epoch_dir(epoch)}: generation {side.generation} on disk, but the chief chose "
            f"generation {generation} (is ckpt_directory on a file system shared by every worker?)"
        )
    return Chosen(epoch, side, kept)
