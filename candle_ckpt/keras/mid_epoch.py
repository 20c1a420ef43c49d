"""A fit resumed from a step (mid-epoch) checkpoint: skip the steps it had done (issue 16).

The preemption decision itself (signals, deadline, step checkpoints, exit)
is :class:`~candle_ckpt.engine.preempt_control.PreemptionController`.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.core.log import OpsLog, counted, position
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.epoch_shape import steps_to_skip
from candle_ckpt.keras import fit_hooks


def resume_mid_epoch(
    model: Any, iterator: Any, train: Any, resumed: Any, engine: CheckpointEngine, log: OpsLog, epoch: int
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
        why = "its epoch iterator could not be found" if iterator is None else f"fit starts at epoch {epoch + 1}"
        log.warning(
            f"restart: the checkpoint was taken at {position(side.epoch, side.step)} but {why}: "
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
        log.info(
            f"restart: skipped {counted(done, 'step')} of epoch {epoch + 1} done before the checkpoint "
            f"in {seconds:.3f} s "
            f"(their batches {'drawn, not trained on' if consume else 'were already consumed'}); "
            f"restored {', '.join(restored)}"
        )

    consume = not (pipeline is not None and pipeline.positioned)
    per = fit_hooks.steps_per_call(iterator)
    steps, changed = steps_to_skip(
        side.step, side.epoch, train.saved_shape(), train.shape, per=per, positioned=not consume
    )
    if changed:  # another batch size or other data: the samples done are skipped, not the steps
        log.warning(changed)
    fit_hooks.skip_steps(iterator, steps, consume, then)
