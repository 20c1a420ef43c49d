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

Then, for all of them, the save (the loop's ``save(reason)``), and the run is told
(``on_saved``, a :class:`~candle_ckpt.engine.preempt.Saved`): the run owns the engine, so
it makes the write durable, records ``stats()["preempt"]``, logs one line and exits
(:func:`~candle_ckpt.engine.preempt.finish_preempted`): by default with the status the
signal's default action gives, 128 + its number (143 for SIGTERM; a deadline or a peer's
request counts as SIGTERM, the scheduler's own stop); ``ckpt_preempt_exit_code=N`` exits
with N, and ``ckpt_preempt_exit_code=return`` stops training and lets ``fit`` return. The
controller reads nothing of the engine: the run hands it the save cost it measured.

The signal handlers are not the controller's: the run's
:class:`~candle_ckpt.engine.signals.SignalOwner` catches the watcher's signals and hands
each to :meth:`~candle_ckpt.engine.preempt.PreemptionWatcher.notice`.

The agreement step is pluggable (:mod:`candle_ckpt.engine.notice`'s ``Agreement``):
``start()``, ``request(reason)``, ``step_end(local) -> bool``, ``now(local) -> bool``,
``requested``, ``stats() -> dict`` and ``close(meet)`` (all workers must get the same
answer at the same call). :data:`~candle_ckpt.engine.notice.SOLO` is one process;
:class:`~candle_ckpt.engine.notice.NoticeAgreement` serves every group and says
nothing on a step unless some rank asked to stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from candle_ckpt.config.preemption import resolve_deadline, signal_numbers, unwatched_warning
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.decision import checkpointing_off
from candle_ckpt.engine.notice import SOLO, Agreement
from candle_ckpt.engine.preempt import PreemptionWatcher, Saved
from candle_ckpt.engine.signals import Lease

__all__ = ["PreemptionController", "plain_logs"]


def plain_logs(logs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Batch logs as numbers (tf_keras may hand over tensors: converted only when a save needs them)."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class PreemptionController:
    """Per step and per epoch end: the request, the agreement, the save, then the run is told (module docstring).

    Args:
        cfg: The job's configuration (``ckpt_preempt_*``, ``ckpt_deadline*``).
        log: The job's log.
        agreement: The agreement step (:data:`SOLO`: one process); :meth:`arm` may hand over another
            for each fit (:class:`~candle_ckpt.engine.run.TrainingRun` does, over the fit's scope of the group).
        who: How this worker is named in the log line (``"worker worker:1 "``).
        steps: The loop's periodic step checkpoints (a :class:`~candle_ckpt.engine.step_plan.StepPlan`), or None.
        save_cost: The seconds one save takes, as the run measured it (0 before any): with one step, what the
            deadline must leave room for.
        on_saved: Called with the :class:`~candle_ckpt.engine.preempt.Saved` preemption save: the run makes it
            durable, records it, and exits (raises) or returns (training stops).
    """

    def __init__(
        self,
        cfg: Any,
        log: OpsLog,
        *,
        agreement: Agreement = SOLO,
        who: str = "",
        steps: Any = None,
        save_cost: Callable[[], float] = lambda: 0.0,
        on_saved: Callable[[Saved], None] | None = None,
    ) -> None:
        self.cfg, self.log, self.agreement, self.who = cfg, log, agreement, who
        self.save_cost, self.on_saved = save_cost, on_saved
        on = not checkpointing_off(cfg)  # nothing is saved, nothing is caught
        deadline, self.deadline_source = resolve_deadline(cfg.deadline, time.time(), os.environ)
        self.watcher = PreemptionWatcher(
            signal_numbers(cfg.preempt_signals) if on else (), deadline if on else None, cfg.deadline_margin
        )
        self.steps = steps  # ckpt_save_steps: a number, or auto
        # The same configuration on every worker: all of them skip the agreement, or none does.
        self.watching = self.watcher.active
        self.enabled = self.watching or bool(steps is not None and steps.on)
        # Whether epoch_end has anything to ask with no request pending (set by arm): a deadline to watch, or
        # other processes to agree with. Without either, the run asks it only once the watcher holds a request.
        self.asks_each_epoch = False
        self.saved_at: tuple[int, int] | None = None  # (epoch, steps done) of the preemption save
        self.mid_epoch = False  # that save was a step checkpoint: the epoch did not end
        self._last, self._step_s = time.monotonic(), 0.0

    @property
    def stopped(self) -> bool:
        """True once a preemption save ended this fit (training must stop)."""
        return self.saved_at is not None

    def arm(self, agreement: Agreement | None = None) -> None:
        """At the start of a fit, before the run's signal owner watches: forget the last one's save and request,
        start the agreement, and have a signal told to the other processes at once (not at the next step end).

        Args:
            agreement: This fit's agreement (over its scope of the group), replacing :attr:`agreement`.
        """
        if agreement is not None:
            self.agreement = agreement
        self.saved_at, self.mid_epoch = None, False
        self._last, self._step_s = time.monotonic(), 0.0
        if self.steps is not None:
            self.steps.arm(time.time())
        warning = None if checkpointing_off(self.cfg) else unwatched_warning(self.cfg.deadline, self.deadline_source)
        if warning:
            self.log.warning(warning)
        self.watcher.arm()
        self.asks_each_epoch = self.watching and (self.agreement is not SOLO or self.watcher.deadline is not None)
        if not self.watching:
            return
        self.agreement.start()
        request = self.agreement.request
        self.watcher.on_signal = lambda trigger: request(trigger.reason)
        if self.watcher.deadline is not None:
            left = self.watcher.time_left() or 0.0
            self.log.info(
                f"deadline in {left:.0f} s ({self.deadline_source}): a checkpoint is saved and training stops "
                f"when less than one step, one save and {self.cfg.deadline_margin:g} s are left"
            )

    def watched(self, lease: Lease) -> None:
        """What the signal owner caught for this fit (:meth:`~candle_ckpt.engine.signals.SignalOwner.watch`),
        said in the log: the signals caught, one held since ``restart()``, those left to the program's handlers."""
        if lease.caught:  # every run says it: ckpt.log only, not the console
            on = " or ".join(lease.caught)
            self.log.note(f"preemption: on {on}, a checkpoint is saved at the next step and training stops")
        if lease.held is not None:
            self.log.warning(
                f"{lease.held.reason} came {time.monotonic() - lease.held.at:.1f} s ago, after restart() and before "
                "fit began: a checkpoint is saved after the first step"
            )
        if lease.left_alone:
            self.log.warning(
                f"preemption: {', '.join(lease.left_alone)} already has a handler this program installed; it is "
                "left alone, so that signal saves nothing (remove the handler, or leave it out of ckpt_preempt_signals)"
            )

    def close(self, ended: bool = True) -> None:
        """At the end of a fit: end the agreement (``ended``: the fit ended as on every rank, so the ranks meet
        once more; a fit that failed says nothing)."""
        self.watcher.on_signal = None
        self.agreement.close(ended)

    def need_s(self) -> float:
        """The time one more step and one save take, as measured in this run (0 before any)."""
        return self._step_s + self.save_cost()

    def _local(self) -> str | None:
        """This process's request (its reason), or None."""
        trigger = self.watcher.due(self.need_s()) if self.watching else None
        return trigger.reason if trigger is not None else None

    def step_end(
        self, epoch: int, step: int, save: Callable[[str], Any], *, last: bool = False, of: int | None = None
    ) -> bool:
        """After step ``step`` (1-based) of epoch index ``epoch``: save and stop if due; True once training must stop.

        Call it on every worker after every step. With ``last`` (the epoch's
        last step) a request waits for :meth:`epoch_end`: a step checkpoint with
        no step left would be an epoch without metrics.

        Args:
            epoch: Completed epochs before this one.
            step: Steps done in this epoch.
            save: ``save(reason)`` commits the step checkpoint of this step; returns its sidecar (or None).
            last: This was the epoch's last step.
            of: The epoch's steps (None: unknown), for the step checkpoints' spacing.

        Raises:
            PreemptExit: from ``on_saved``, after the save, unless ``ckpt_preempt_exit_code=return``.
        """
        now = time.monotonic()
        self._step_s, self._last = now - self._last, now
        if self.saved_at is not None:
            return True
        if not self.enabled or last:
            return False
        if self.watching and self.agreement.step_end(self._local()):
            self._stop(epoch, step, save)
            return True
        if self.steps is not None:
            self.steps.step_end(step, self._step_s, save, epoch=epoch, of=of)
        return False

    def during_validation(self, epoch: int, step: int, save: Callable[[str], Any]) -> bool:
        """At a batch of ``fit``'s validation, with the state after ``step`` steps of epoch index ``epoch`` held (the
        step before the epoch's last: :class:`~candle_ckpt.engine.capture.HeldStep`): save it and stop if a request
        is due. One process only (the request is its own). True once training must stop.

        Raises:
            PreemptExit: as :meth:`step_end`.
        """
        if self.saved_at is not None:
            return True
        if not self.watching or not self.agreement.now(self._local()):
            return False
        self.log.info(
            f"{self.watcher.pending.reason if self.watcher.pending else 'a stop request'} came during fit's "
            f"validation of epoch {epoch + 1}: saving the state held before its last step; the rerun trains that "
            "step again, then validates"
        )
        self._stop(epoch, step, save)
        return True

    def epoch_end(self, epoch: int, saved: bool, force: Callable[[str], Any], *, last_epoch: bool = False) -> bool:
        """After the checkpoint of ``epoch`` completed epochs: True once training must stop.

        The workers agree at once (whatever ``ckpt_preempt_check`` says). A caller may skip the call while
        :attr:`asks_each_epoch` is false and the watcher holds no request (``watcher.pending``): it returns
        False then.

        Args:
            epoch: Completed epochs.
            saved: Whether the save rule saved this epoch.
            force: ``force(reason)`` saves this epoch anyway (called only if not ``saved``).
            last_epoch: The job is done: a request is only logged (every worker knows this alike).

        Raises:
            PreemptExit: from ``on_saved``, after the save, unless ``ckpt_preempt_exit_code=return``.
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
        self._stop(epoch, None, lambda reason: None if saved else force(reason))
        return True

    def _stop(self, epoch: int, step: int | None, save: Callable[[str], Any]) -> None:
        """Save, then tell the run (``on_saved``), which ends the save: durable, recorded, then exit or return."""
        trigger, asked = self.watcher.pending, None
        if trigger is None:  # another worker was asked: its reason if the agreement carries it, else "peer"
            asked = self.agreement.requested
            trigger = self.watcher.trigger(asked[1] if asked else "peer")
        self.saved_at, self.mid_epoch = (epoch, step or 0), step is not None
        began = time.monotonic()
        side = save(trigger.reason if step is not None else f"preempt:{trigger.reason}")
        if self.on_saved is not None:
            self.on_saved(Saved(trigger, epoch, step, side, began, asked, self.agreement.stats()))

    def drain_budget(self) -> float:
        """Seconds the drain may take before the process exits: ``ckpt_drain_timeout``, less near the deadline."""
        left = self.watcher.time_left()
        budget = self.cfg.drain_timeout
        return budget if left is None else max(0.0, min(budget, left - 1.0))
