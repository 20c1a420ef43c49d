"""Save every worker at the same step when any one is told to stop, then stop or exit.

:class:`PreemptSync` is called once after every training step on every worker
(``JobRunner.step_end``, the tf_keras callback's ``on_train_batch_end``):

1. the local request: :class:`~candle_ckpt.engine.preempt.PreemptionWatcher`
   (a signal this process caught, the handler only records it; or a
   deadline with less than one step, one save and the margin left);
2. :class:`~candle_ckpt.distributed.agreement.SaveAgreement`: every
   ``ckpt_preempt_check`` steps, one all-reduce of the flags, so all workers
   learn "save now" after the same step; a worker that learns it from a peer
   records the trigger ``"peer"``;
3. every worker saves that step through ``CheckpointEngine.save_step``: the
   chief commits the step checkpoint (``ckpts/steps/GGG``), every other
   worker writes its scratch copy; the write is durable when it returns;
4. then training stops (``ckpt_preempt_exit_code`` None) or the process exits
   with that code, so a requeue script can tell "preempted" from "failed".

Takes an engine and a capture function; imports no adapter.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from candle_ckpt.config.deadline import resolve_deadline, unwatched_warning
from candle_ckpt.config.signals import signal_numbers
from candle_ckpt.core.log import OpsLog
from candle_ckpt.distributed.agreement import SaveAgreement
from candle_ckpt.engine.decision import checkpointing_off
from candle_ckpt.engine.preempt import PreemptExit, PreemptionWatcher, Trigger, preempt_message, preempt_record
from candle_ckpt.engine.resume import checkpoint_dir


def _plain(logs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Batch logs as numbers (tf_keras may hand over tensors: converted only when a save needs them)."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class PreemptSync:
    """Per step: the local request, the agreement, and the save of the agreed step on every worker.

    Args:
        engine: The job's (or this worker's) ``CheckpointEngine``.
        capture: Returns the :class:`~candle_ckpt.engine.engine.Capture` of the
            state as of now (called on the training thread, at the agreed step).
        agreement: Shared decision across workers.
        watcher: This process's :class:`~candle_ckpt.engine.preempt.PreemptionWatcher`.
        ops: Where the save is logged.
        exit_code: None: stop training after the save; an int: exit with it.
        who: How this worker is named in the log (``"worker worker:1 "``).
    """

    def __init__(
        self,
        engine: Any,
        capture: Callable[[], Any],
        agreement: SaveAgreement,
        watcher: PreemptionWatcher,
        ops: OpsLog,
        *,
        exit_code: int | None = None,
        who: str = "",
    ) -> None:
        self.engine, self.capture, self.agreement = engine, capture, agreement
        self.watcher, self.ops = watcher, ops
        self.exit_code = exit_code
        self.who = who
        # Same configuration on every worker, so all skip the agreement or none does.
        self.enabled = watcher.active
        self.saved_at: tuple[int, int] | None = None  # (epoch, step) of the preemption save
        self._last, self._step_s = time.monotonic(), 0.0

    @property
    def stopped(self) -> bool:
        return self.saved_at is not None

    def arm(self) -> None:
        self._last = time.monotonic()
        if self.enabled:
            self.watcher.arm()

    def close(self) -> None:
        self.watcher.disarm()

    def _local(self) -> bool:
        """This worker's request: a signal, or the deadline closer than one step, one save and the margin."""
        now = time.monotonic()
        self._step_s, self._last = now - self._last, now
        saves = [r["snapshot_s"] + r["save_s"] for r in self.engine.records[-3:]]
        return self.watcher.due(self._step_s + max(saves, default=0.0)) is not None

    def step_end(self, epoch: int, step: int, logs: Mapping[str, Any] | None = None) -> bool:
        """One step has ended (``step`` steps done in epoch index ``epoch``): True once training must stop.

        Call it on every worker after every step. When the workers agree, the
        step is saved on every worker before this returns; with an exit code
        the process exits here instead (``PreemptExit``, a ``SystemExit``, after the commit).
        """
        if self.saved_at is not None:
            return True
        if not self.enabled or not self.agreement.step_end(self._local()):
            return False
        plain = _plain(logs)

        def save(trigger: Trigger) -> Any:
            return self.engine.save_step(epoch, step, plain, self.capture, trigger.reason)

        self._finish(epoch, step, save)
        return True

    def epoch_end(self, epoch: int, save: Callable[[str], Any]) -> bool:
        """After the checkpoint of ``epoch`` completed epochs: True once training must stop.

        For a request that came at an epoch's last step, or a loop that never
        calls :meth:`step_end`: all workers agree at once. ``save(reason)``
        saves this epoch if the policy skipped it (called only if they agree)
        and returns the committed sidecar or None.
        """
        if self.saved_at is not None:
            return True
        if not self.enabled or not self.agreement.now(self._local()):
            return False
        self._finish(epoch, None, lambda trigger: save(f"preempt:{trigger.reason}"))
        return True

    def _finish(self, epoch: int, step: int | None, save: Callable[[Trigger], Any]) -> None:
        """Save (every worker), record and log, then stop or raise ``PreemptExit``."""
        trigger = self.watcher.pending or self.watcher.trigger("peer")  # "peer": another worker was asked
        self.saved_at = (epoch, step or 0)
        start = time.monotonic()
        side = save(trigger)
        self.engine.finish()  # durable (or its error raised per ckpt_on_error) before we stop
        if side is None and step is None and self.engine.scratch_dir is None and self.engine.records:
            if self.engine.records[-1]["epoch"] == epoch and "step" not in self.engine.records[-1]:
                side = self.engine.store.read_sidecar(epoch)  # the epoch checkpoint that serves
        path = checkpoint_dir(self.engine.store.layout, side) if side is not None else None
        record = preempt_record(trigger, epoch, step, path, self.exit_code)
        record.update(save_s=round(time.monotonic() - start, 6), agreement=self.agreement.stats())
        self.engine.preempt = record
        what = f"committed {path}" if path else "saved its scratch copy" if self.engine.scratch_dir else "saved"
        self.ops.warning(preempt_message(trigger, self.who + what, epoch, step, self.exit_code))
        if self.exit_code is not None:
            raise PreemptExit(self.exit_code)


def make_sync(cfg: Any, engine: Any, capture: Callable[[], Any], strategy: Any, info: Any, ops: OpsLog) -> PreemptSync:
    """A :class:`PreemptSync` from the job's configuration and this worker's place in the cluster.

    Checkpointing off (``ckpt_save_interval=0``) catches nothing, as in the fit callback.
    """
    on = not checkpointing_off(cfg)
    deadline, source = resolve_deadline(cfg.deadline, time.time(), os.environ)
    warning = unwatched_warning(cfg.deadline, source) if on else None
    if warning:
        ops.warning(warning)
    watcher = PreemptionWatcher(
        signal_numbers(cfg.preempt_signals) if on else (), deadline if on else None, cfg.deadline_margin
    )
    agreement = SaveAgreement(strategy, info.num_workers, every=cfg.preempt_check)
    who = f"worker {info.task_type}:{info.task_id} " if info.num_workers > 1 else ""
    return PreemptSync(engine, capture, agreement, watcher, ops, exit_code=cfg.preempt_exit_code, who=who)
