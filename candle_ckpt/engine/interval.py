"""The automatic step-checkpoint interval (``ckpt_save_steps=auto``): a pure policy, fed with measurements.

The rule, in seconds of training between two step checkpoints, with ``C`` the cost of one step checkpoint to
the training thread (the time ``save_step`` blocks the caller, and the slowdown of the steps right after it)
and ``M`` the mean time between failures:

- **overhead bound**: ``C / 0.02``, so that checkpointing costs at most 2% of training time without failures;
- **Young/Daly**: ``sqrt(2 x C x M)``, the interval that loses the least time to saves and failures together;
  saving more often than this costs more in saves than it saves in lost work.

The interval is the larger of the two, expressed in steps with the measured step time (an exponential moving
average) and rounded up; :attr:`Interval.reason` names the bound that won (``overhead`` or ``young-daly``).
Within an epoch whose end is checkpointed anyway (:func:`spread`), auto splits the epoch into equal parts instead,
as many as the interval fits nearest: a step checkpoint two steps before the epoch's own would cost a save and
spare almost nothing. ``M`` is ``ckpt_mtbf`` when given, else learned from the run's restart history
(:func:`~candle_ckpt.core.history.failure_rate`: ``failures`` over ``seconds`` of wall time):
``seconds / failures`` after a failure, and before any the larger of :data:`PRIOR_MTBF_S` and the time the run
has gone without one. Before a save has been measured (or a step), ``C`` is unknown and no step checkpoint is
taken (reason ``unmeasured``): the first epoch's checkpoint is the probe.

Nothing here reads a clock or a file: the controller passes every time in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: The largest share of training time that step checkpoints may cost without failures.
OVERHEAD = 0.02
#: The mean time between failures assumed before the run has failed once (``ckpt_mtbf=auto``): 4 hours, the
#: order of a preemptible node's life on a busy cluster. A run that has gone longer without a failure uses that.
PRIOR_MTBF_S = 4 * 3600.0
#: Weight of a new step time in the moving average.
EMA_WEIGHT = 0.2
#: How many of the newest save costs are averaged.
SAVES_KEPT = 3
AUTO = "auto"


@dataclass(frozen=True)
class Interval:
    """One decision: every ``steps`` steps (0: no step checkpoint), and why.

    Attributes:
        steps: The interval in steps of an epoch (a step checkpoint after every ``steps``-th step); 0: none.
        reason: ``fixed`` (a number was given), ``off`` (0 was given), ``unmeasured`` (no save or step time
            yet), ``overhead`` (the 2% bound won) or ``young-daly`` (the failure rate's bound won).
        seconds: The interval in seconds of training (None for ``fixed``, ``off``, ``unmeasured``).
        step_s: The step time used.
        save_s: The save cost used (seconds the training thread is blocked per step checkpoint).
        mtbf_s: The mean time between failures used.
    """

    steps: int
    reason: str
    seconds: float | None = None
    step_s: float | None = None
    save_s: float | None = None
    mtbf_s: float | None = None

    def as_dict(self) -> dict[str, object]:
        """For ``stats()["steps"]``: every field, the times rounded."""
        out: dict[str, object] = {"interval": self.steps, "reason": self.reason}
        for name in ("seconds", "step_s", "save_s", "mtbf_s"):
            value = getattr(self, name)
            out[name] = None if value is None else round(value, 6)
        return out


def mtbf(failures: int, seconds: float, prior_s: float = PRIOR_MTBF_S) -> float:
    """The mean time between failures: ``seconds / failures``, or before any failure ``max(prior_s, seconds)``."""
    if failures > 0:
        return max(seconds, 1e-9) / failures
    return max(prior_s, seconds)


def choose(step_s: float, save_s: float, mtbf_s: float, overhead: float = OVERHEAD) -> Interval:
    """The interval for a step time, a save cost and a mean time between failures (see the module docstring).

    Args:
        step_s: Seconds one training step takes (> 0).
        save_s: Seconds one step checkpoint blocks training (>= 0).
        mtbf_s: Mean seconds between failures (> 0).
        overhead: The largest share of training time saves may cost (0 < overhead < 1).

    Returns:
        The interval, at least one step.
    """
    bound = save_s / overhead
    daly = math.sqrt(2.0 * save_s * mtbf_s)
    seconds, reason = (bound, "overhead") if bound >= daly else (daly, "young-daly")
    steps = max(1, math.ceil(seconds / step_s - 1e-9))
    return Interval(steps, reason, seconds, step_s, save_s, mtbf_s)


def spread(every: int, steps: int) -> int:
    """The interval ``every`` within an epoch of ``steps`` steps whose end is saved anyway: the epoch split into
    the whole number of equal parts nearest to ``steps / every`` (at least one: then ``steps``, the epoch's own
    checkpoint alone). The same number of saves as every ``every`` steps plus the epoch end, or one fewer when
    the last part would be under half an interval; the largest gap at most 1.5 x ``every``. Young/Daly's cost is
    flat near its optimum: at 0.75 to 1.5 times the interval it is at most 8% above it."""
    parts = max(1, math.floor(steps / every + 0.5))
    return math.ceil(steps / parts)


@dataclass
class StepInterval:
    """``ckpt_save_steps`` as one object: a number passes through; ``auto`` is chosen from what is measured.

    Args:
        setting: ``ckpt_save_steps``: an int (0: off) or ``"auto"``.
        mtbf_setting: ``ckpt_mtbf``: seconds, or ``"auto"`` (learned, see :meth:`failures`).
        prior_s: The mean time between failures assumed before the first failure.
    """

    setting: int | str = AUTO
    mtbf_setting: float | str = AUTO
    prior_s: float = PRIOR_MTBF_S
    step_s: float | None = None
    saves: list[float] = field(default_factory=list)
    failed: tuple[int, float] = (0, 0.0)

    @property
    def auto(self) -> bool:
        return self.setting == AUTO

    def observe_step(self, seconds: float) -> None:
        """One training step took ``seconds`` (not the first of a fit: it compiles; not one that saved)."""
        if seconds <= 0:
            return
        self.step_s = seconds if self.step_s is None else (1 - EMA_WEIGHT) * self.step_s + EMA_WEIGHT * seconds

    def observe_save(self, seconds: float) -> None:
        """A checkpoint would block (or blocked) training ``seconds`` as a step checkpoint."""
        if seconds >= 0:
            self.saves = [*self.saves, seconds][-SAVES_KEPT:]

    def revise_save(self, seconds: float) -> None:
        """The newest save cost ``seconds`` in all: its blocked time and the slowdown of the steps after it."""
        if self.saves and seconds >= 0:
            self.saves = [*self.saves[:-1], seconds]

    def failures(self, failures: int, seconds: float) -> None:
        """The run's failures so far and the wall time they are spread over (``history.failure_rate``)."""
        self.failed = (int(failures), float(seconds))

    def mtbf_s(self) -> float:
        """``ckpt_mtbf``, or the mean time between failures learned from :meth:`failures`."""
        if self.mtbf_setting != AUTO:
            return float(self.mtbf_setting)
        return mtbf(*self.failed, prior_s=self.prior_s)

    def current(self) -> Interval:
        """The interval now."""
        if not self.auto:
            steps = int(self.setting)
            return Interval(steps, "fixed" if steps > 0 else "off")
        if self.step_s is None or not self.saves:
            return Interval(0, "unmeasured", step_s=self.step_s, mtbf_s=self.mtbf_s())
        return choose(self.step_s, sum(self.saves) / len(self.saves), self.mtbf_s())
