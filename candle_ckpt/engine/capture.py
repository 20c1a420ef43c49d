"""One save's two inputs: what the adapter captured (:class:`Capture`) and the sidecar the engine starts from.

An adapter's ``capture()`` returns a :class:`Capture` on the training thread;
the engine (:mod:`candle_ckpt.engine.engine`) makes the sidecar of it
(:func:`save_template`) and commits its files (on the writer's thread in async
mode). The store fills in the sidecar's files, the generation and the timings at
the commit; everything else is made here: the epoch, the best so far, the
metrics, the run's elapsed time (carried over a resume), the checkpoint it
resumed from, the snapshot's own ``extra``, the load and drain statistics, the
job's epoch limit and the lineage.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.policy import BestState
from candle_ckpt.core.sidecar import Sidecar, clean_logs
from candle_ckpt.storage.store import FileSpec

__all__ = ["Capture", "epoch_limit", "new_lineage", "save_template"]


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
    # Set when an asynchronous save could not copy the state (it would not fit in host memory): the files write
    # from the live variables, so the engine commits this one before training goes on, and says why, once.
    inline_why: str | None = None


def new_lineage() -> str:
    """A fresh lineage id (docs/campaigns.rst): a run that resumed none, or rolled back to an exact epoch."""
    return uuid.uuid4().hex[:16]


def epoch_limit(cfg: CkptConfig) -> dict[str, Any]:
    """The job's epoch limit (``gParameters["epochs"]``), kept so that ``candle-ckpt campaign`` tells a run
    that has reached it (done) from one still training, from its newest sidecar alone."""
    epochs = cfg.epochs
    return {"epochs": epochs} if isinstance(epochs, int) and not isinstance(epochs, bool) else {}


def save_template(
    cfg: CkptConfig,
    epoch: int,
    cap: Capture,
    logs: Mapping[str, Any],
    reason: str,
    best: BestState,
    *,
    mode: str,
    elapsed: float,
    resumed: Sidecar | None,
    io: dict[str, Any],
    lineage: str,
) -> Sidecar:
    """The sidecar of a save of ``epoch``, before the store fills in its files, generation and timings
    (``mode``: the best metric's direction; ``io``: the load and last drain records)."""
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
        resumed_from=resumed.epoch if resumed else None,
        keras_version=cap.keras_version,
        backend=cap.backend,
        extra={**cap.extra, **({"io": io} if io else {}), **epoch_limit(cfg)},
        lineage=lineage,
    )
