"""Turn "an epoch has ended" into policy, snapshot, commit and prune.

Shared by :class:`~candle_ckpt.callback.CandleCheckpointCallback` and the
epoch runner, so both have the same guarantees. Knows nothing about Keras:
the caller passes a ``capture`` function that returns the files to write.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt import layout as L
from candle_ckpt.oplog import OpsLog
from candle_ckpt.params import CkptConfig
from candle_ckpt.policy import BestState, is_improvement, keep_policy, resolve_mode, save_reason
from candle_ckpt.sidecar import Sidecar, clean_logs
from candle_ckpt.store import CheckpointError, CheckpointStore, FileSpec
from candle_ckpt.writer import make_writer


class CheckpointSaveError(CheckpointError):
    """A save failed; earlier checkpoints are intact (``ckpt_on_error=raise``)."""


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


# restart() leaves here what it restored, per directory, for the writer of the same job.
_RESUMED: dict[str, Sidecar] = {}


def note_resumed(directory: str, sidecar: Sidecar | None) -> None:
    key = os.path.realpath(directory)
    if sidecar is None:
        _RESUMED.pop(key, None)
    else:
        _RESUMED[key] = sidecar


def resumed_from(directory: str) -> Sidecar | None:
    return _RESUMED.get(os.path.realpath(directory))


class CheckpointEngine:
    """The save side of one job on one ``ckpt_directory``.

    Creating it validates the directory (writable, not locked by another
    process) and removes a crashed writer's leftovers, so problems surface
    at creation and not at epoch 50.
    """

    def __init__(self, cfg: CkptConfig, ops: OpsLog, *, fs=None, writable: bool = True) -> None:
        self.cfg = cfg
        self.ops = ops
        self.store = CheckpointStore(cfg.directory, fs=fs, checksum=cfg.checksum)
        if writable:  # False: decisions only (a non-chief worker never writes to ckpt_directory)
            self.store.open_for_write()
        self.keep = keep_policy(cfg.keep_mode, cfg.keep_limit)
        self.mode = resolve_mode(cfg.save_best_metric, cfg.save_best_mode)
        self.adopt_resumed(resumed_from(cfg.directory))
        self.writer = make_writer(cfg.async_save, cfg.async_timeout, ops.warning)
        self.records: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.start_time = time.time()

    def adopt_resumed(self, resumed: Sidecar | None) -> None:
        """Continue from the checkpoint a restart loaded: best-tracking, elapsed
        time, and protection of that checkpoint from pruning."""
        cfg = self.cfg
        self.resumed = resumed
        self.best = BestState(cfg.save_best_metric, self.mode)
        self.time_base = 0.0
        if resumed is not None:
            self.time_base = float(resumed.time_elapsed or 0.0)
            if resumed.best_epoch is not None and resumed.save_best_metric == cfg.save_best_metric:
                value = resumed.best_metric_last
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.best = BestState(cfg.save_best_metric, self.mode, float(value), resumed.best_epoch)

    # -- decisions ---------------------------------------------------------------
    def decide(self, epoch: int, logs: Mapping[str, Any]) -> tuple[str | None, BestState]:
        """Return (reason to save or None, best state if this epoch is saved)."""
        cfg = self.cfg
        improved, best = False, self.best
        if cfg.save_best and cfg.save_interval != 0 and epoch >= cfg.skip_epochs:
            if cfg.save_best_metric not in logs:
                present = ", ".join(sorted(logs)) or "none"
                raise ValueError(
                    f"ckpt_save_best_metric {cfg.save_best_metric!r} is not in the training logs; "
                    f"metrics present: {present}"
                )
            value = float(logs[cfg.save_best_metric])
            if is_improvement(value, self.best.value, self.mode):
                best, improved = BestState(cfg.save_best_metric, self.mode, value, epoch), True
        reason = save_reason(
            epoch,
            epochs=cfg.epochs if cfg.epochs is not None else -1,
            skip_epochs=cfg.skip_epochs,
            save_interval=cfg.save_interval,
            improved_best=improved,
            save_best=cfg.save_best,
        )
        return reason, best

    # -- saving --------------------------------------------------------------------
    def save(
        self, epoch: int, logs: Mapping[str, Any], capture: Callable[[], Capture], *, reason: str | None = None
    ) -> bool:
        """Save ``epoch`` if the policy says so (or ``reason`` forces it).

        Returns True if a save was started. With ``ckpt_on_error=raise`` a
        failure raises :class:`CheckpointSaveError`; with ``warn`` it is logged.
        """
        logs = dict(logs or {})
        decided, best = self.decide(epoch, logs)
        reason = reason or decided
        if reason is None:
            return False
        self._check_writer()  # an async failure of the previous save surfaces here
        try:
            cap = capture()
            self.best = best
            template = Sidecar(
                epoch=epoch,
                generation=0,
                model_file=cap.model_file,
                files={},
                save_best_metric=self.cfg.save_best_metric,
                best_metric_last=best.value,
                best_epoch=best.epoch,
                save_best_mode=self.mode,
                timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                time_elapsed=round(self.time_base + time.time() - self.start_time, 3),
                metadata=self.cfg.metadata,
                logs=clean_logs(logs),
                reason=reason,
                resumed_from=self.resumed.epoch if self.resumed else None,
                keras_version=cap.keras_version,
                backend=cap.backend,
                extra=cap.extra,
            )
            self.writer.submit(lambda: self._commit(epoch, cap, template, best))
        except _SaveFailure as failure:
            self._failed(failure.epoch, failure.err)
            return False
        except Exception as err:
            self._failed(epoch, err)
            return False
        return True

    def _check_writer(self) -> None:
        try:
            self.writer.check()
        except _SaveFailure as failure:
            self._failed(failure.epoch, failure.err)

    def _commit(self, epoch: int, cap: Capture, template: Sidecar, best: BestState) -> None:
        try:
            self._commit_now(epoch, cap, template, best)
        except BaseException as err:
            raise _SaveFailure(epoch, err) from err

    def _commit_now(self, epoch: int, cap: Capture, template: Sidecar, best: BestState) -> None:
        side = self.store.commit(epoch, cap.files, template, best_epoch=best.epoch if self.cfg.save_best else None)
        rec = {
            "epoch": epoch,
            "reason": template.reason,
            "bytes": side.total_bytes,
            "snapshot_s": round(cap.snapshot_s, 6),
            "save_s": side.save_duration_s,
            "mb_per_s": side.save_mb_per_s,
        }
        self.records.append(rec)
        self.ops.info(
            f"epoch {epoch}: saved {L.epoch_name(epoch)} ({template.reason}) {side.total_bytes / 1e6:.1f} MB "
            f"in {side.save_duration_s:.3f} s ({side.save_mb_per_s:.1f} MB/s)"
        )
        protected = [self.resumed.epoch] if self.resumed else []
        deleted = self.store.prune(self.keep.select, protected)
        if deleted:
            names = ", ".join(L.epoch_name(e) for e in deleted)
            self.ops.info(f"pruned epochs {names} (keep_mode {self.cfg.keep_mode}, keep_limit {self.cfg.keep_limit})")

    def _failed(self, epoch: int, err: BaseException) -> None:
        msg = f"epoch {epoch}: checkpoint save failed: {type(err).__name__}: {err}"
        self.errors.append(msg)
        if self.cfg.on_error == "raise":
            self.ops.error(msg + " (ckpt_on_error=raise: stopping)")
            raise CheckpointSaveError(msg + "; earlier checkpoints are intact") from err
        self.ops.warning(msg + " (ckpt_on_error=warn: training continues; earlier checkpoints are intact)")

    def finish(self, timeout: float | None = None) -> None:
        """Wait for the write in flight; surface its error per ``ckpt_on_error``."""
        self.writer.join(timeout)
        self._check_writer()

    def stats(self) -> dict[str, Any]:
        return {
            "saves": list(self.records),
            "errors": list(self.errors),
            "writer_wait_s": list(self.writer.wait_s),
            "async": self.writer.is_async,
        }

    def report(self) -> None:
        """Log a summary of this run's checkpoints (CANDLE's ``report_final``)."""
        self.finish()
        recs = self.records
        if not recs:
            self.ops.info("report: no checkpoints were written in this run")
            return
        total = sum(r["bytes"] for r in recs)
        secs = sum(r["save_s"] for r in recs)
        best = self.best
        self.ops.info(
            f"report: {len(recs)} checkpoints, {total / 1e6:.1f} MB in {secs:.2f} s "
            f"({total / max(secs, 1e-9) / 1e6:.1f} MB/s); last epoch {recs[-1]['epoch']}; "
            f"best {best.metric}={best.value} at epoch {best.epoch}; errors {len(self.errors)}"
        )
