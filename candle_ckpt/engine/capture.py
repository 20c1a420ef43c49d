"""What an adapter hands the engine for one save, the sidecar made of it, and how a failed commit travels back.

An adapter's ``capture()`` returns a :class:`Capture` on the training thread;
the engine commits its files (on the writer's thread in async mode). A
commit that fails there is wrapped in :class:`_SaveFailure`, so the training
thread learns which epoch failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.policy import BestState
from candle_ckpt.core.sidecar import Sidecar, clean_logs
from candle_ckpt.storage.store import FileSpec


class _SaveFailure(Exception):
    """Carries the epoch of a failed commit from the writer to the caller."""

    def __init__(self, epoch: int, err: BaseException) -> None:
        super().__init__(str(err))
        self.epoch = epoch
        self.err = err


@dataclass
class Capture:
    """What an adapter captured on the training thread for one save."""

    files: list[FileSpec]
    model_file: str
    nbytes: int
    snapshot_s: float = 0.0
    keras_version: str | None = None
    backend: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # A multi-process save: parts(work_dir) writes this process's part; ``files`` are the primary's own.
    parts: Callable[[str], Any] | None = None
    sharding: dict[str, str] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)  # kept in a sharded checkpoint's manifest


def sidecar_template(
    cfg: CkptConfig,
    mode: str,
    epoch: int,
    cap: Capture,
    logs: Mapping[str, Any],
    reason: str,
    best: BestState,
    elapsed: float,
    resumed_from: int | None,
    io: dict[str, Any],
) -> Sidecar:
    """The sidecar of a save, before the store fills in its files, generation and timings."""
    return Sidecar(
        epoch=epoch,
        generation=0,
        model_file=cap.model_file,
        files={},
        save_best_metric=cfg.save_best_metric,
        best_metric_last=best.value,
        best_epoch=best.epoch,
        save_best_mode=mode,
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        time_elapsed=round(elapsed, 3),
        metadata=cfg.metadata,
        logs=clean_logs(logs),
        reason=reason,
        resumed_from=resumed_from,
        keras_version=cap.keras_version,
        backend=cap.backend,
        extra={**cap.extra, **io},
    )
