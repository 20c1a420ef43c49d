"""Turn "an epoch has ended" into policy, snapshot, commit and prune.

Shared by :class:`~candle_ckpt.keras.callback.CandleCheckpointCallback` and the
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

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointSaveError, CheckpointUploadError
from candle_ckpt.core.keep import keep_policy
from candle_ckpt.core.log import OpsLog, human_bytes
from candle_ckpt.core.policy import BestState, is_improvement, resolve_mode, save_reason
from candle_ckpt.core.sidecar import Sidecar, clean_logs
from candle_ckpt.engine.writer import make_writer, slow_writer_message
from candle_ckpt.storage.store import CheckpointStore, FileSpec


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


def missing_metric_message(cfg: CkptConfig, epoch: int, logs: Mapping[str, Any]) -> str:
    """Why ``ckpt_save_best_metric`` is not in the logs, and the three ways out."""
    metric = cfg.save_best_metric
    present = ", ".join(sorted(logs)) or "none"
    fixes = [
        "pass validation data to fit (validation_data=... or validation_split=0.2)"
        if metric.startswith("val_")
        else f"log {metric!r} (compile the model with that metric)",
        f"set ckpt_save_best_metric to a metric that is logged ({present})",
        "or set ckpt_save_best=False to checkpoint without tracking the best epoch",
    ]
    return (
        f"ckpt_save_best_metric {metric!r} is not in the training logs of epoch {epoch}; metrics present: "
        f"{present}. To fix it: {'; '.join(fixes)} (checkpoint directory: {os.path.abspath(cfg.directory)})"
    )


class CheckpointEngine:
    """The save side of one job on one ``ckpt_directory``.

    Creating it validates the directory (writable, not locked by another
    process) and removes a crashed writer's leftovers, so problems surface
    at creation and not at epoch 50.
    """

    def __init__(self, cfg: CkptConfig, ops: OpsLog, *, fs=None, scratch_dir: str | None = None) -> None:
        self.cfg = cfg
        # Checkpointing off (ckpt_save_interval=0) writes nothing at all: not even ckpt.log.
        self.ops = ops if cfg.save_interval != 0 or scratch_dir is not None else OpsLog(None, ops.logger)
        self.store = CheckpointStore(cfg.directory, fs=fs, checksum=cfg.checksum, flat=cfg.layout == "flat")
        # scratch_dir: a non-chief worker of a multi-worker job. It decides and
        # snapshots exactly as the chief does (same policy, same async order:
        # wait, snapshot, submit) but writes each snapshot into scratch_dir and
        # removes it; it never opens, commits to, prunes or uploads the store.
        self.scratch_dir = scratch_dir
        if scratch_dir is None and cfg.save_interval != 0:  # 0: checkpointing off, nothing is written at all
            self.store.open_for_write()
        self.keep = keep_policy(cfg.keep_mode, cfg.keep_limit)
        self.mode = resolve_mode(cfg.save_best_metric, cfg.save_best_mode)
        # What a restart restored reaches this engine through its adapter
        # (adopt_resumed), never through process-global state.
        self.adopt_resumed(None)
        self.writer = make_writer(cfg.async_save, cfg.async_timeout, ops.write, self._exit_error)
        self.records: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.preempt: dict[str, Any] | None = None  # the preemption save of this run (stats()["preempt"])
        # (epoch, bytes, perf_counter) of the last write handed to the writer, and
        # whether "the writer cannot keep up" has been said (once per engine).
        self._submitted: tuple[int, int, float] | None = None
        self._slow_said = False
        self.start_time = time.time()
        # Hook: called with each committed sidecar, on the writer's thread, after
        # the commit and the prune. The remote mirror (ckpt_upload_url) uses it.
        self.after_commit: list[Callable[[Sidecar], None]] = []
        self.remote = None
        if cfg.upload_url and scratch_dir is None:
            from candle_ckpt.storage.remote import RemoteMirror

            self.remote = RemoteMirror(cfg, self.store, ops, self.keep.select)
            self.after_commit.append(self.remote.committed)

    def adopt_resumed(self, resumed: Sidecar | None, load: dict[str, Any] | None = None) -> None:
        """Continue from the checkpoint a restart loaded: best-tracking, elapsed
        time, load statistics, and protection of that checkpoint from pruning."""
        cfg = self.cfg
        self.resumed = resumed
        self.load = load
        self.best = BestState(cfg.save_best_metric, self.mode)
        self.time_base = 0.0
        if resumed is not None:
            self.time_base = float(resumed.time_elapsed or 0.0)
            if resumed.best_epoch is not None and resumed.save_best_metric == cfg.save_best_metric:
                value = resumed.best_metric_last
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.best = BestState(cfg.save_best_metric, self.mode, float(value), resumed.best_epoch)
        if cfg.best_metric_last is not None and math.isfinite(cfg.best_metric_last):
            # CANDLE's ckpt_best_metric_last: the value to beat. Its epoch is known only
            # when it is the value of the checkpoint restart() loaded.
            epoch = self.best.epoch if self.best.value == cfg.best_metric_last else None
            self.best = BestState(cfg.save_best_metric, self.mode, cfg.best_metric_last, epoch)
        self._durable_best = self.best  # the best as of the last commit that succeeded

    # -- decisions ---------------------------------------------------------------
    def decide(self, epoch: int, logs: Mapping[str, Any]) -> tuple[str | None, BestState]:
        """Return (reason to save or None, best state if this epoch is saved)."""
        cfg = self.cfg
        improved, best = False, self.best
        # Checked at every epoch end, skipped epochs included: a wrong metric fails at epoch 1, as in CANDLE.
        if cfg.save_best and cfg.save_interval != 0 and cfg.save_best_metric not in logs:
            raise ValueError(missing_metric_message(cfg, epoch, logs))
        if cfg.save_best and cfg.save_interval != 0 and epoch >= cfg.skip_epochs:
            value = float(logs[cfg.save_best_metric])
            best, improved = self.best.update(value, epoch)
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

        In async mode the order is: surface the previous write's error, wait
        for the write in flight (the wait is recorded in ``stats()``), take
        the snapshot with ``capture`` on this thread, hand the commit to the
        writer. Waiting *before* the snapshot keeps at most one snapshot alive.

        Returns True if a save was started. With ``ckpt_on_error=raise`` a
        failure (of this save, or of the previous async one) raises
        :class:`CheckpointSaveError`; with ``warn`` it is logged.
        """
        logs = dict(logs or {})
        self._check_writer()  # a finished async job's failure surfaces at the next epoch end
        self._check_remote()
        if reason is not None and self.cfg.save_best_metric not in logs:
            # A forced save without the metric (the runner's epoch 0 after init)
            # leaves best-tracking as it is instead of failing.
            def decide() -> tuple[str | None, BestState]:
                return None, self.best
        else:

            def decide() -> tuple[str | None, BestState]:
                return self.decide(epoch, logs)

        decided, best = decide()
        if (reason or decided) is None and not self._beats_durable_best_only(logs):
            return False
        try:
            self._wait_for_writer(epoch)
        except TimeoutError as err:  # the previous write hangs: skip this save, memory stays bounded
            self._failed(epoch, err)
            return False
        if self._check_writer():  # it failed and best tracking went back: decide again
            decided, best = decide()
        if (reason or decided) is None:
            return False
        reason = reason or decided
        try:
            cap = capture()
            template = self.template(epoch, cap, logs, reason, best)
            self.best = best
            self._submitted = (epoch, cap.nbytes, time.perf_counter())
            self.writer.submit(
                lambda: self._commit(epoch, cap, template, best), label=f"the checkpoint write of epoch {epoch}"
            )
        except _SaveFailure as failure:
            self._failed(failure.epoch, failure.err)
            return False
        except Exception as err:
            self._failed(epoch, err)
            return False
        return True

    def template(self, epoch: int, cap: Capture, logs: Mapping[str, Any], reason: str, best: BestState) -> Sidecar:
        """The sidecar of a save, before the store fills in its files, generation and timings."""
        return Sidecar(
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
            extra={**cap.extra, **self._io_stats()},
        )

    def save_step(
        self, epoch: int, step: int, logs: Mapping[str, Any], capture: Callable[[], Capture], reason: str
    ) -> Sidecar | None:
        """Commit a step checkpoint now, synchronously: ``step`` steps into the epoch after ``epoch``.

        See :func:`candle_ckpt.engine.step_save.save_step` (the write in
        flight is joined first; a non-chief writes its scratch copy).
        """
        from candle_ckpt.engine.step_save import save_step

        return save_step(self, epoch, step, logs, capture, reason)

    def _wait_for_writer(self, epoch: int) -> None:
        """Wait for the write in flight; the first time training has to wait for it, say so (once)."""
        busy, start = self.writer.in_flight(), time.perf_counter()
        self.writer.wait()
        if busy and not self._slow_said and self._submitted is not None:
            self._slow_said = True
            self.ops.warning(slow_writer_message(epoch, *self._submitted, start, time.perf_counter()))

    def _beats_durable_best_only(self, logs: Mapping[str, Any]) -> bool:
        """True if this epoch is no new best only because of a best still being written.

        If that write fails, this epoch *is* the new best: the caller must
        wait for the outcome before deciding (rare; costs one wait).
        """
        pending, durable = self.best, self._durable_best
        if not (self.cfg.save_best and self.writer.in_flight() and pending.epoch != durable.epoch):
            return False
        try:
            value = float(logs[self.cfg.save_best_metric])
        except (KeyError, TypeError, ValueError):
            return False  # decide() has already said what is wrong with the logs
        return is_improvement(value, durable.value, self.mode)

    def _check_writer(self) -> bool:
        """Surface a finished async job's failure; True if one was reported (warn mode)."""
        try:
            self.writer.check()
        except _SaveFailure as failure:
            self._failed(failure.epoch, failure.err)
            return True
        return False

    def _exit_error(self, err: BaseException) -> None:
        """The last async write failed and the process is exiting: log it, loudly."""
        epoch, cause = (err.epoch, err.err) if isinstance(err, _SaveFailure) else (None, err)
        msg = f"epoch {epoch}: checkpoint save failed at exit: {type(cause).__name__}: {cause}"
        self.errors.append(msg)
        self.ops.error(msg + "; earlier checkpoints are intact")

    def _commit(self, epoch: int, cap: Capture, template: Sidecar, best: BestState) -> None:
        try:
            self._commit_now(epoch, cap, template, best)
        except BaseException as err:
            raise _SaveFailure(epoch, err) from err

    def _commit_now(self, epoch: int, cap: Capture, template: Sidecar, best: BestState) -> None:
        if self.scratch_dir is not None:
            self._write_scratch(epoch, cap)
            self._durable_best = best
            return
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
        self._durable_best = best
        try:
            superseded = self.store.steps.supersede(epoch)  # the step checkpoints of earlier epochs
        except OSError as err:  # this commit is durable; a leftover step checkpoint is older than it
            superseded = []
            self.ops.warning(f"could not remove the superseded step checkpoints: {err}")
        if superseded:
            self.ops.info(f"removed step checkpoint {', '.join(f'steps/{L.epoch_name(g)}' for g in superseded)}")
        self.ops.info(
            f"epoch {epoch}: saved {L.epoch_name(epoch)} ({template.reason}) {human_bytes(side.total_bytes)} "
            f"in {side.save_duration_s:.3f} s ({side.save_mb_per_s:.1f} MB/s)"
        )
        protected = [self.resumed.epoch] if self.resumed else []
        deleted = self.store.prune(self.keep.select, protected)
        if deleted:
            self.ops.info(
                f"pruned epochs {', '.join(L.epoch_name(e) for e in deleted)} "
                f"(keep_mode {self.cfg.keep_mode}, keep_limit {self.cfg.keep_limit})"
            )
        for hook in self.after_commit:
            hook(side)

    def _write_scratch(self, epoch: int, cap: Capture) -> None:
        """A non-chief's save: write the files into its scratch directory, then remove it."""
        tmp, fs = self.scratch_dir, self.store.fs
        try:
            if os.path.lexists(tmp):
                fs.rmtree(tmp)
            fs.makedirs(tmp)
            for spec in cap.files:
                f = fs.create(os.path.join(tmp, spec.name))
                try:
                    spec.write(f)
                finally:
                    f.abort()  # closed without fsync: the copy is deleted at once
        except Exception as err:  # a worker's scratch copy failing must not stop the cluster
            self.ops.warning(
                f"epoch {epoch}: temporary save in {tmp} failed: {type(err).__name__}: {err} "
                "(the chief's checkpoints are unaffected)"
            )
        finally:
            if os.path.lexists(tmp):
                fs.rmtree(tmp)

    def _io_stats(self) -> dict[str, Any]:
        """Load and upload statistics recorded in the sidecar's ``extra``."""
        io: dict[str, Any] = {}
        if self.load is not None:
            io["load"] = self.load
        if self.remote is not None and self.remote.records:
            io["last_upload"] = self.remote.records[-1]
        return {"io": io} if io else {}

    def _check_remote(self) -> None:
        if self.remote is None:
            return
        for err in self.remote.take_errors():
            msg = f"checkpoint upload failed: {err}"
            self.errors.append(msg)
            if self.cfg.on_error == "raise":
                self.ops.error(msg + " (ckpt_on_error=raise: stopping)")
                raise CheckpointUploadError(msg + "; local checkpoints are intact") from err
            self.ops.warning(msg + " (ckpt_on_error=warn: training continues; local checkpoints are intact)")

    def _failed(self, epoch: int, err: BaseException) -> None:
        if self.best.epoch == epoch:  # that best was never written: track against the durable one
            self.best = self._durable_best
        msg = f"epoch {epoch}: checkpoint save failed: {type(err).__name__}: {err}"
        self.errors.append(msg)
        if self.cfg.on_error == "raise":
            self.ops.error(msg + " (ckpt_on_error=raise: stopping)")
            raise CheckpointSaveError(msg + f"; earlier checkpoints in {self.store.layout.root} are intact") from err
        self.ops.warning(msg + " (ckpt_on_error=warn: training continues; earlier checkpoints are intact)")

    def finish(self, timeout: float | None = None) -> None:
        """Wait for the write in flight; surface its error per ``ckpt_on_error``."""
        self.writer.join(timeout)
        self._check_writer()
        if self.remote is not None:
            self.remote.finish(self.cfg.async_timeout if timeout is None else timeout)
            self._check_remote()

    def open(self) -> None:
        """Take the directory's writer lock again, e.g. for a second ``fit`` (no-op if held).

        A non-chief worker (``scratch_dir``) never writes the store, and with
        checkpointing off (``ckpt_save_interval=0``) nothing is written at all.
        """
        if self.scratch_dir is None and self.cfg.save_interval != 0:
            self.store.open_for_write()

    def close(self, timeout: float | None = None) -> None:
        """Release the writer lock once no write is in flight; never raises.

        A failed write was logged where it failed and is raised by
        :meth:`finish`; here it only must not keep the directory locked. A
        write still running after the timeout keeps the lock: a writer exists.
        """
        if not self.writer.join(timeout):
            self.ops.warning(f"{self.store.layout.root}: the writer lock stays held while the write in flight runs")
            return
        if self.remote is not None:
            self.remote.finish(self.cfg.async_timeout if timeout is None else timeout)
        self.store.close()

    def stats(self) -> dict[str, Any]:
        """Every save (bytes, durations, MB/s), the load of a resume, every upload, errors."""
        return {
            "saves": list(self.records),
            "load": self.load,
            "uploads": list(self.remote.records) if self.remote is not None else [],
            "errors": list(self.errors),
            "writer_wait_s": list(self.writer.wait_s),
            "async": self.writer.is_async,
            "preempt": self.preempt,
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
            f"report: {len(recs)} checkpoints, {human_bytes(total)} in {secs:.2f} s "
            f"({total / max(secs, 1e-9) / 1e6:.1f} MB/s); last epoch {recs[-1]['epoch']}; "
            f"best {best.metric}={best.value} at epoch {best.epoch}; errors {len(self.errors)}"
        )
