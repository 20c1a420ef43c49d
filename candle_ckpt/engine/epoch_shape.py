"""A fit resumed from a step checkpoint whose epoch has another step count: where to start, and one line on it.

A step checkpoint records how many steps its epoch had and, where the input says, their batch size (the
``mid`` of ``train.state.npz``). A job restarted with another batch size (halved after running out of memory
on a new node, doubled on a bigger one) or other data has epochs of another length, and "skip the 8 steps done"
then means other samples: with batches twice as large, every sample of the epoch and the epoch's end with no
step run (logs without ``loss``); with batches half as large, half the samples done trained on twice. So the
resumed epoch skips the same share of its steps, rounded down: with the same data, the samples done to within
one batch (the line gives both counts where the batch sizes are known). Such a run cannot be bit-identical to
one that kept its batch size, and the line says that too. Framework-free: the Keras 3 callback gives the shapes
(:mod:`candle_ckpt.keras.mid_epoch`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from candle_ckpt.core.log import counted, position


@dataclass(frozen=True)
class EpochShape:
    """An epoch's steps (``fit``'s ``params["steps"]``) and their batch size; None where not known."""

    steps: int | None = None
    batch: int | None = None

    @classmethod
    def make(cls, steps: Any, batch: Any) -> EpochShape:
        """The shape, each part kept only if it is a count (a step count of None, an unknown batch size)."""
        return cls(_count(steps), _count(batch))

    @classmethod
    def of(cls, doc: Any) -> EpochShape:
        """The shape a step checkpoint recorded (its ``mid``; an older checkpoint's: unknown)."""
        return cls.make(doc.get("of"), doc.get("batch")) if isinstance(doc, dict) else cls()

    def says(self) -> str:
        size = f" of batch size {self.batch}" if self.batch else ""
        return f"{counted(self.steps or 0, 'step')}{size}"


def _count(value: Any) -> int | None:
    """A positive whole number as an ``int`` (a NumPy integer too: a ``steps_per_epoch`` computed with NumPy)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        return None
    return int(value)


def steps_to_skip(
    done: int, epoch: int, then: EpochShape, now: EpochShape, *, per: int = 1, positioned: bool = False
) -> tuple[int, str | None]:
    """The steps of the resumed epoch to skip, and the warning to log if its step count changed (else None).

    The same share of the epoch is skipped, rounded down: with the same data in other batches, the samples done
    (to within a batch). The same number of steps in batches of another size is no change: the shards of a
    ``DataParallel`` job restored into another number of processes (a process's batch and data both change).

    Args:
        done: Steps done in the epoch when the checkpoint was taken (the sidecar's ``step``).
        epoch: Completed epochs before it (the sidecar's ``epoch``).
        then: The epoch's shape at the checkpoint; now: this ``fit``'s.
        per: Keras's ``steps_per_execution``: the skip is a multiple of it.
        positioned: The input was put back at its saved position (a kept ``tf.data`` or grain iterator): the
            steps are only counted, so ``done`` are, and the line says so.
    """
    if then.steps is None or now.steps is None or then.steps == now.steps:
        return done, None  # the same epoch, or one not known (an older checkpoint's, an endless input)
    was = f"restart: the checkpoint was taken at {position(epoch, done)} of {then.says()}, but this fit's epoch has "
    tail = "The run is not bit-identical to one that kept its batch size and data"
    if positioned:
        return done, f"{was}{now.says()}: its input was put back where it was; its steps count on from {done}. {tail}"
    # A step is left at least: an epoch of none logs no loss (and JAX's fit raises when its first epoch has none).
    skip = min(done * now.steps // then.steps, now.steps - 1)
    skip -= skip % max(per, 1)
    how = f"the same share of the epoch ({done} of {then.steps})"
    if then.batch and now.batch:
        samples, skipped = done * then.batch, skip * now.batch
        how = f"the {counted(samples, 'sample')} done before"
        how = how if skipped == samples else f"{counted(skipped, 'sample')}, against {samples} done before"
    whole = "resume from an epoch checkpoint (ckpt_restart_epoch) to train the epoch whole again"
    return skip, f"{was}{now.says()}: {counted(skip, 'step')} skipped, {how}. {tail}; {whole}"
