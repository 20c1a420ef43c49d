"""The one preemption controller: notice a stop request, agree on it, save, record, then exit or return.

Every training run (:class:`~candle_ckpt.engine.run.TrainingRun`, whatever its
front end: the Keras 3 callback, the tf_keras callback, ``JobRunner``) owns one
:class:`PreemptionController`, armed for the length of one ``fit`` / ``train()``
and called at two points:

- :meth:`PreemptionController.step_end` after every training step: the local
  request (a signal the :class:`~candle_ckpt.engine.preempt.PreemptionWatcher`
  caught, or a deadline closer than one step, one save and the margin), then
  the agreement step, then, when they agree, the step checkpoint; also the
  periodic step checkpoints of ``ckpt_save_steps`` where the loop asks for them;
- :meth:`PreemptionController.epoch_end` after the epoch's checkpoint: a
  request that came at the epoch's last step, or from a loop that never calls
  ``step_end``, is answered by that epoch's checkpoint (forced if the save
  rule skipped it).

Then the same sequence for all of them: the save, ``engine.finish()`` (the
write is durable, or its error raised), the sidecar of what was committed,
``stats()["preempt"]``, one log line, and the end: by default the process
exits with the status the signal's default action gives, 128 + its number
(143 for SIGTERM; a deadline or a peer's request counts as SIGTERM, the
scheduler's own stop); ``ckpt_preempt_exit_code=N`` exits with N, and
``ckpt_preempt_exit_code=return`` stops training and lets ``fit`` return.

The agreement step is pluggable (:mod:`candle_ckpt.engine.notice`): anything with
``step_end(local) -> bool``, ``now(local) -> bool`` and ``stats() -> dict`` (all
workers must get the same answer at the same call), and optionally ``start()`` /
``close(meet)``. :data:`~candle_ckpt.engine.notice.SOLO` is one process;
:class:`~candle_ckpt.engine.notice.NoticeAgreement` serves every group and says
nothing on a step unless some rank asked to stop.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from candle_ckpt.config.deadline import resolve_deadline, unwatched_warning
from candle_ckpt.config.signals import signal_numbers
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.decision import checkpointing_off
from candle_ckpt.engine.notice import SOLO, Agreement
from candle_ckpt.engine.preempt import (
    PreemptExit,
    PreemptionWatcher,
    Trigger,
    end_early_catch,
    preempt_message,
    preempt_record,
)
from candle_ckpt.engine.resume import checkpoint_dir
from candle_ckpt.engine.step_plan import StepPlan
from candle_ckpt.storage.drain import DRAIN_INCOMPLETE_EXIT

#: ``ckpt_preempt_exit_code`` words: exit with 128 + the signal's number, or return from ``fit``.
EXIT_SIGNAL, EXIT_RETURN = "signal", "return"


def plain_logs(logs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Batch logs as numbers (tf_keras may hand over tensors: converted only when a save needs them)."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def exit_status(setting: int | str, trigger: Trigger) -> int | None:
    """The process's exit status after a preemption save, or None to return from ``fit``.

    ``"signal"``: 128 + the signal's number, what its default action gives
    (143 for SIGTERM; a deadline or a peer's request: 143). An int: itself.
    """
    if setting == EXIT_RETURN:
        return None
    if setting == EXIT_SIGNAL:
        return 128 + (trigger.signum if trigger.signum is not None else int(signal.SIGTERM))
    return int(setting)


class PreemptionController:
    """Per step and per epoch end: the request, the agreement, the save, then exit or return (module docstring).

    Args:
        cfg: The job's configuration (``ckpt_preempt_*``, ``ckpt_deadline*``, ``ckpt_save_steps``).
        engine: The job's (or this worker's) ``CheckpointEngine``, read only: ``records``,
            ``finish()``, ``store``, ``scratch_dir`` and ``drained`` are used.
        log: The job's log.
        agreement: The agreement step (:data:`SOLO`: one process); :meth:`arm` may hand over another
            for each fit (:class:`~candle_ckpt.engine.run.TrainingRun` does, over the fit's scope of the group).
        who: How this worker is named in the log line (``"worker worker:1 "``).
        step_saves: Whether this loop takes ``ckpt_save_steps``'s periodic step checkpoints.
        on_record: Called with the preemption save's record (:attr:`record`) before the exit or the return;
            the training run keeps it where ``stats()["preempt"]`` reads it.
    """

    def __init__(
        self,
        cfg: Any,
        engine: Any,
        log: OpsLog,
        *,
        agreement: Agreement = SOLO,
        who: str = "",
        step_saves: bool = False,
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.on_record = on_record
        self.record: dict[str, Any] | None = None  # the preemption save of the last fit (stats()["preempt"])
        self.cfg, self.engine, self.log, self.agreement, self.who = cfg, engine, log, agreement, who
        on = not checkpointing_off(cfg)  # nothing is saved, nothing is caught
        deadline, self.deadline_source = resolve_deadline(cfg.deadline, time.time(), os.environ)
        self.watcher = PreemptionWatcher(
            signal_numbers(cfg.preempt_signals) if on else (), deadline if on else None, cfg.deadline_margin
        )
        self.steps = StepPlan(cfg, engine, on and step_saves)  # ckpt_save_steps: a number, or auto
        # The same configuration on every worker: all of them skip the agreement, or none does.
        self.watching = self.watcher.active
        self.enabled = self.watching or self.steps.on
        self.saved_at: tuple[int, int] | None = None  # (epoch, steps done) of the preemption save
        self.mid_epoch = False  # that save was a step checkpoint: the epoch did not end
        self._last, self._step_s = time.monotonic(), 0.0

    @property
    def stopped(self) -> bool:
        """True once a preemption save ended this fit (training must stop)."""
        return self.saved_at is not None

    def arm(self, agreement: Agreement | None = None) -> None:
        """At the start of a fit: forget the last one's save and install the signal handlers.

        Args:
            agreement: This fit's agreement (over its scope of the group), replacing :attr:`agreement`.
        """
        if agreement is not None:
            self.agreement = agreement
        self.saved_at, self.mid_epoch, self.record = None, False, None
        self._last, self._step_s = time.monotonic(), 0.0
        self.steps.arm(time.time())
        warning = None if checkpointing_off(self.cfg) else unwatched_warning(self.cfg.deadline, self.deadline_source)
        if warning:
            self.log.warning(warning)
        if not self.watching:
            end_early_catch()  # restart() caught the signals for this fit, which watches none
            return
        caught = self.watcher.arm()
        getattr(self.agreement, "start", lambda: None)()
        request = getattr(self.agreement, "request", None)
        if request is not None:  # a signal is told to the other processes at once, not at the next step end
            self.watcher.on_signal = lambda trigger: request(trigger.reason)
            if self.watcher.pending is not None:  # held since restart()
                request(self.watcher.pending.reason)
        if self.watcher.deadline is not None:
            left = self.watcher.time_left() or 0.0
            self.log.info(
                f"deadline in {left:.0f} s ({self.deadline_source}): a checkpoint is saved and training stops "
                f"when less than one step, one save and {self.cfg.deadline_margin:g} s are left"
            )
        if caught:  # every run says it: ckpt.log only, not the console
            on = " or ".join(caught)
            self.log.note(f"preemption: on {on}, a checkpoint is saved at the next step and training stops")
        held = self.watcher.pending
        if held is not None:
            self.log.warning(
                f"{held.reason} came {time.monotonic() - held.at:.1f} s ago, after restart() and before fit began: "
                "a checkpoint is saved after the first step"
            )
        if self.watcher.left_alone:
            self.log.warning(
                f"preemption: {', '.join(self.watcher.left_alone)} already has a handler this program installed; it is "
                "left alone, so that signal saves nothing (remove the handler, or leave it out of ckpt_preempt_signals)"
            )

    def close(self, ended: bool = True) -> None:
        """At the end of a fit (on the main thread): put the previous signal handlers back and end the agreement
        (``ended``: the fit ended as on every rank, so the ranks meet once more; a fit that failed says nothing)."""
        self.watcher.disarm()
        getattr(self.agreement, "close", lambda meet: None)(ended)

    def need_s(self) -> float:
        """The time one more step and one save take, as measured in this run (0 before any)."""
        saves = [r["snapshot_s"] + r["save_s"] for r in self.engine.records[-3:]]
        return self._step_s + max(saves, default=0.0)

    def _local(self) -> str | None:
        """This process's request (its reason), or None."""
        trigger = self.watcher.due(self.need_s()) if self.watching else None
        return trigger.reason if trigger is not None else None

    def step_end(self, epoch: int, step: int, save: Callable[[str], Any], *, last: bool = False) -> bool:
        """After step ``step`` (1-based) of epoch index ``epoch``: save and stop if due; True once training must stop.

        Call it on every worker after every step. With ``last`` (the epoch's
        last step) a request waits for :meth:`epoch_end`: a step checkpoint with
        no step left would be an epoch without metrics.

        Args:
            epoch: Completed epochs before this one.
            step: Steps done in this epoch.
            save: ``save(reason)`` commits the step checkpoint of this step; returns its sidecar (or None).
            last: This was the epoch's last step.

        Raises:
            PreemptExit: after the save, unless ``ckpt_preempt_exit_code=return``.
        """
        now = time.monotonic()
        self._step_s, self._last = now - self._last, now
        if self.saved_at is not None:
            return True
        if not self.enabled or last:
            return False
        if self.watching and self.agreement.step_end(self._local()):
            self._finish(epoch, step, save)
            return True
        self.steps.step_end(step, self._step_s, save)
        return False

    def epoch_end(self, epoch: int, saved: bool, force: Callable[[str], Any], *, last_epoch: bool = False) -> bool:
        """After the checkpoint of ``epoch`` completed epochs: True once training must stop.

        The workers agree at once (whatever ``ckpt_preempt_check`` says).

        Args:
            epoch: Completed epochs.
            saved: Whether the save rule saved this epoch.
            force: ``force(reason)`` saves this epoch anyway (called only if not ``saved``).
            last_epoch: The job is done: a request is only logged (every worker knows this alike).

        Raises:
            PreemptExit: after the save, unless ``ckpt_preempt_exit_code=return``.
        """
        if self.saved_at is not None:
            return True
        if not self.watching:
            return False
        if last_epoch:
            if self.watcher.pending is not None:
                self.log.info(f"{self.watcher.pending.reason} came at the end of the last epoch: training is complete")
            return False
        if not self.agreement.now(self._local()):
            return False
        self._finish(epoch, None, lambda reason: None if saved else force(reason))
        return True

    def _finish(self, epoch: int, step: int | None, save: Callable[[str], Any]) -> None:
        """Save, make it durable, record and log it; then raise :class:`PreemptExit` unless told to return."""
        trigger, asked = self.watcher.pending, None
        if trigger is None:  # another worker was asked: its reason if the agreement carries it, else "peer"
            asked = getattr(self.agreement, "requested", None)
            trigger = self.watcher.trigger(asked[1] if asked else "peer")
        self.saved_at, self.mid_epoch = (epoch, step or 0), step is not None
        start = time.monotonic()
        side = save(trigger.reason if step is not None else f"preempt:{trigger.reason}")
        # Durable (or its error raised per ckpt_on_error) before we stop; then drained to the persistent tier
        # within ckpt_drain_timeout and the time left to the deadline.
        if getattr(self.engine, "remote", None) is not None:
            self.engine.finish(drain_s=self._drain_budget())
        else:
            self.engine.finish()
        if not isinstance(side, Sidecar):
            side = self._epoch_sidecar(epoch) if step is None else None
        path = checkpoint_dir(self.engine.store.layout, side) if side is not None else None
        code = exit_status(self.cfg.preempt_exit_code, trigger)
        drained = getattr(self.engine, "drained", None)
        if drained is False and code is not None:
            code = DRAIN_INCOMPLETE_EXIT  # the save is on this node's fast tier only: say so to the scheduler
        record = preempt_record(trigger, epoch, step, path, code)
        record["drained"] = drained
        record.update(save_s=round(time.monotonic() - start, 6), agreement=self.agreement.stats())
        if asked:
            record["requested_by"] = asked[0]  # the rank that was asked
        self.record = record
        if self.on_record is not None:
            self.on_record(record)
        what = f"committed {path}" if path else "saved its scratch copy" if self.engine.scratch_dir else ""
        what = (what or "no checkpoint could be committed") + (f" at process {asked[0]}'s request" if asked else "")
        if drained is not None:
            what += " and drained it to the persistent tier" if drained else ", NOT drained to the persistent tier"
        self.log.warning(preempt_message(trigger, self.who + what, epoch, step, code))
        if code is not None:
            raise PreemptExit(code)

    def _drain_budget(self) -> float:
        """Seconds the drain may take before the process exits: ``ckpt_drain_timeout``, less near the deadline."""
        left = self.watcher.time_left()
        budget = self.cfg.drain_timeout
        return budget if left is None else max(0.0, min(budget, left - 1.0))

    def _epoch_sidecar(self, epoch: int) -> Sidecar | None:
        """The committed checkpoint of ``epoch`` that serves the request, if this worker committed one."""
        records = self.engine.records
        if self.engine.scratch_dir is None and records and records[-1]["epoch"] == epoch:
            if "step" not in records[-1]:
                return self.engine.store.read_sidecar(epoch)
        return None
