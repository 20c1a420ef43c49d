"""Preemption, wall-time deadlines and step checkpoints inside ``model.fit`` (issue 16).

:class:`FitPreemption` is the part of
:class:`~candle_ckpt.keras.callback.CandleCheckpointCallback` that acts
between epochs' ends: at each batch end it asks the
:class:`~candle_ckpt.engine.preempt.PreemptionWatcher` whether a signal came
or the deadline is near (and ``ckpt_save_steps`` whether a step checkpoint is
due), commits a step checkpoint through the engine when one is, and then
stops training or exits with ``ckpt_preempt_exit_code``.

At the epoch's last step a request waits for the epoch end, where the epoch
checkpoint serves (forced if the keep policy would skip that epoch): a step
checkpoint with no step left to run would be an epoch without metrics.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from candle_ckpt.config.deadline import resolve_deadline, unwatched_warning
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.config.signals import signal_numbers
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.decision import checkpointing_off
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.preempt import (
    PreemptExit,
    PreemptionWatcher,
    Trigger,
    end_early_catch,
    preempt_message,
    preempt_record,
)
from candle_ckpt.engine.resume import checkpoint_dir
from candle_ckpt.keras import fit_hooks


class FitPreemption:
    """Decide at each batch and epoch end whether to save a step checkpoint or stop (see the module docstring).

    Args:
        cfg: The job's configuration (``ckpt_preempt_*``, ``ckpt_deadline*``, ``ckpt_save_steps``).
        ops: The job's log.
        engine: The job's engine: :meth:`CheckpointEngine.save_step` commits.
    """

    def __init__(self, cfg: CkptConfig, ops: OpsLog, engine: CheckpointEngine) -> None:
        self.cfg, self.ops, self.engine = cfg, ops, engine
        on = not checkpointing_off(cfg)  # nothing is saved, nothing is caught
        deadline, self.deadline_source = resolve_deadline(cfg.deadline, time.time(), os.environ)
        self.watcher = PreemptionWatcher(
            signal_numbers(cfg.preempt_signals) if on else (), deadline if on else None, cfg.deadline_margin
        )
        self.enabled = on and (self.watcher.active or cfg.save_steps > 0)
        # Where several workers agree: called at every decision with this worker's request (or None), it
        # returns the cluster's (the first request any worker has, the same on all). One worker: as is.
        self.agree: Callable[[Trigger | None], Trigger | None] = lambda trigger: trigger
        self.stopped = False  # a step checkpoint ended this fit in the middle of an epoch
        self._last = time.monotonic()
        self._step_s = 0.0

    def begin(self) -> None:
        """At ``on_train_begin``: install the signal handlers (the previous ones come back at :meth:`end`)."""
        self.stopped = False
        self._last, self._step_s = time.monotonic(), 0.0
        warning = None if checkpointing_off(self.cfg) else unwatched_warning(self.cfg.deadline, self.deadline_source)
        if warning:
            self.ops.warning(warning)
        if not self.enabled:
            end_early_catch()  # restart() caught the signals for this fit, which watches none
            return
        caught = self.watcher.arm()
        if self.watcher.deadline is not None:
            left = self.watcher.time_left() or 0.0
            self.ops.info(
                f"deadline in {left:.0f} s ({self.deadline_source}): a checkpoint is saved and training stops "
                f"when less than one step, one save and {self.cfg.deadline_margin:g} s are left"
            )
        if caught:
            self.ops.info(f"preemption: {', '.join(caught)} save a checkpoint at the next step and stop")
        held = self.watcher.pending
        if held is not None:
            self.ops.warning(
                f"{held.reason} came {time.monotonic() - held.at:.1f} s ago, after restart() and before fit began: "
                "a checkpoint is saved after the first step"
            )
        if self.watcher.kept:
            self.ops.warning(
                f"preemption: {', '.join(self.watcher.kept)} already has a handler this program installed; it is "
                "left alone, so that signal saves nothing (remove the handler, or leave it out of ckpt_preempt_signals)"
            )

    def end(self) -> None:
        """At train end (or when fit ends otherwise): put the previous signal handlers back."""
        self.watcher.disarm()

    def need_s(self) -> float:
        """The time one more step and one save take, as measured in this run (0 before any)."""
        saves = [r["snapshot_s"] + r["save_s"] for r in self.engine.records[-3:]]
        return self._step_s + max(saves, default=0.0)

    def batch_end(self, epoch: int, step: int, steps: int | None, save: Callable[[str, int], Sidecar | None]) -> None:
        """After step ``step`` (1-based) of epoch index ``epoch``: save a step checkpoint and stop if due.

        Args:
            epoch: Keras's epoch index (completed epochs before this one).
            step: Steps done in this epoch.
            steps: Steps in the epoch, if known (``params["steps"]``).
            save: ``save(reason, step)`` commits the step checkpoint; returns its sidecar.
        """
        now = time.monotonic()
        self._step_s, self._last = now - self._last, now
        if not self.enabled or self.stopped:
            return
        last = isinstance(steps, int) and step >= steps
        trigger = self.agree(self.watcher.due(self.need_s()))
        if trigger is not None and not last:
            self.finish(trigger, save(trigger.reason, step), epoch, step)
        elif trigger is None and self.cfg.save_steps and step % self.cfg.save_steps == 0 and not last:
            save("steps", step)

    def epoch_end(self, epoch: int, epochs: int | None, saved: bool, force: Callable[[str], bool]) -> bool:
        """After the epoch save of epoch ``epoch`` (completed epochs): stop here if a request is pending.

        Returns True when training must stop (with ``ckpt_preempt_exit_code`` set, :class:`PreemptExit` is raised).

        Args:
            epoch: Completed epochs.
            epochs: ``fit``'s epochs (at the last one the job is done: nothing to stop).
            saved: Whether the keep policy saved this epoch.
            force: Saves this epoch anyway with the given reason; returns whether it did.
        """
        if not self.enabled or self.stopped:
            return False
        trigger = self.agree(self.watcher.due(self.need_s()))
        if trigger is None:
            return False
        if epochs is not None and epoch >= epochs:
            self.ops.info(f"{trigger.reason} came at the end of the last epoch: training is complete")
            return False
        if not saved:
            saved = force(f"preempt:{trigger.reason}")
        self.engine.finish()  # the epoch checkpoint is durable before we stop
        records = self.engine.records
        side = None
        if saved and records and records[-1]["epoch"] == epoch and "step" not in records[-1]:
            side = self.engine.store.read_sidecar(epoch)
        self.finish(trigger, side, epoch, None)
        return True

    def finish(self, trigger: Trigger, side: Sidecar | None, epoch: int, step: int | None) -> None:
        """Record and log the preemption save, then stop training (``stopped``) or raise :class:`PreemptExit`."""
        code = self.cfg.preempt_exit_code
        path = checkpoint_dir(self.engine.store.layout, side) if side is not None else None
        self.engine.preempt = preempt_record(trigger, epoch, step, path, code)
        what = f"committed {path}" if path else "no checkpoint could be committed"
        self.ops.warning(preempt_message(trigger, what, epoch, step, code))
        self.stopped = step is not None
        if code is not None:
            raise PreemptExit(code)


def resume_mid_epoch(
    model: Any, iterator: Any, train: Any, resumed: Any, engine: CheckpointEngine, ops: OpsLog, epoch: int
) -> None:
    """Before the first epoch of a fit resumed from a step checkpoint: skip the steps it had done.

    The steps are taken from ``fit``'s epoch iterator as ``fit`` would have
    (:func:`~candle_ckpt.keras.fit_hooks.skip_steps`); then the callbacks,
    metric variables and RNG states of the save are put back, and so are the
    optimizer's scalar variables (a ``LearningRateScheduler``'s
    ``on_epoch_begin`` must not apply twice). The time is logged and kept in
    ``stats()["load"]``.
    """
    side = resumed.sidecar
    if epoch != side.epoch or iterator is None:
        why = "its epoch iterator could not be found" if iterator is None else f"fit starts at epoch index {epoch}"
        ops.warning(
            f"restart: the checkpoint was taken after step {side.step} of epoch index {side.epoch} but {why}: "
            f"the epoch runs from its first batch and the run will not be bit-identical "
            f"(pass initial_epoch={side.epoch} to fit)"
        )
        return
    optimizer = getattr(model, "optimizer", None)
    scalars = [(v, v.numpy()) for v in getattr(optimizer, "variables", []) if len(v.shape) == 0]
    pipeline = train.pipeline

    def then(done: int, seconds: float) -> None:
        for variable, value in scalars:
            variable.assign(value)
        restored = train.restore_mid()
        if engine.load is not None:
            engine.load.update(skipped_steps=done, skip_s=round(seconds, 6))
        ops.info(
            f"restart: skipped the {done} steps of epoch index {epoch} done before the checkpoint in {seconds:.3f} s "
            f"(their batches {'drawn, not trained on' if consume else 'were already consumed'}); "
            f"restored {', '.join(restored)}"
        )

    consume = not (pipeline is not None and pipeline.positioned)
    fit_hooks.skip_steps(iterator, side.step, consume, then)
