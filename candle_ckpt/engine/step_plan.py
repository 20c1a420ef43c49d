"""``ckpt_save_steps`` for one training loop: when a periodic step checkpoint is due, and ``stats()["steps"]``.

The wiring of :class:`~candle_ckpt.engine.interval.StepInterval` (the pure rule) to the run: the
:class:`~candle_ckpt.engine.preempt_control.PreemptionController` hands each step's time to
:meth:`StepPlan.step_end`, which times each step checkpoint it takes: the save cost ``C`` is the seconds it blocked
training plus what the :data:`AFTER_STEPS` steps after it took beyond the step time before it. Before the first,
the engine's records of the epoch checkpoints estimate it (``snapshot_s + save_s``: all of it blocks a step
checkpoint written at once; for one written in the background, the copy blocks and the write slows the steps after
it, which the first one measures). At the start of each fit it reads the run's failures from its restart history
(``restarts.jsonl`` of both tiers, :func:`~candle_ckpt.core.history.failure_rate`).

A step checkpoint is due once ``interval`` steps have passed since the last one of the epoch (or its beginning):
for a number N, steps N, 2N, ...; for ``auto``, whose interval moves, a kill never loses more than the interval in
force; in an epoch whose end saves anyway, auto's steps are spread evenly over the epoch instead
(:func:`~candle_ckpt.engine.interval.spread`: at most 1.5 intervals apart, never more saves). Step times left
out: the first step of a fit (it compiles), the first of an epoch (it carries the epoch end: validation, the
epoch's checkpoint) and the one after a step checkpoint. A fit resumed from a step checkpoint counts from that
step; one process that has saved nothing yet takes the resumed checkpoint's save time as the probe's.

**Several processes** decide as one, with no meeting of their own: the primary's interval (its measurements, the
commit's own cost counted) travels with each commit's outcome
(:attr:`~candle_ckpt.engine.engine.CheckpointEngine.note_out`), and every process adopts it at the same point of
its run (:attr:`~candle_ckpt.engine.engine.CheckpointEngine.agreed`): a synchronous commit's end, or the next
save's wait for an asynchronous one. So every process takes its step checkpoints at the same steps; before the
first word is adopted none takes any (the first epoch's checkpoint carries it: step checkpoints from the second
epoch on, the third with asynchronous writes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from candle_ckpt.core.history import failure_rate
from candle_ckpt.engine.decision import saves_epoch
from candle_ckpt.engine.interval import SAVES_KEPT, Interval, StepInterval, spread
from candle_ckpt.engine.restart_history import History, with_this_start

#: Steps between two evaluations of the interval (and after each save, or a new word of the primary).
REFRESH_STEPS = 16
#: Steps after a step checkpoint whose time beyond the moving step time counts in its cost: the write slows the
#: steps after it too (about a third of its blocked time again, over 10 to 30 steps, on a 2-core machine).
AFTER_STEPS = 32


class StepPlan:
    """The periodic step checkpoints of one loop (see the module docstring).

    Args:
        cfg: The job's configuration (``ckpt_save_steps``, ``ckpt_mtbf``).
        engine: The job's engine: ``records``, ``log``, ``group``, the note attributes.
        on: Whether this loop takes periodic step checkpoints at all (checkpointing on, and the loop asks).
    """

    def __init__(self, cfg: Any, engine: Any, on: bool) -> None:
        self.cfg, self.engine = cfg, engine
        self.policy = StepInterval(cfg.save_steps if on else 0, cfg.mtbf)
        self.on = on and cfg.save_steps != 0
        self.shared = self.on and self.policy.auto and getattr(engine.group, "size", 1) > 1
        self._seen = 0  # engine.records observed so far
        self._skip = True  # the next step time is left out
        self._saved_at = 0  # the step of this epoch's last step checkpoint (0: none yet)
        self._measured = False  # a step checkpoint's blocked time was measured: commit records are no longer used
        self._now, self._steps = Interval(0, "unmeasured"), 0  # the interval in force, taken again _steps ago
        self._every = 0  # the steps between two step checkpoints as taken (the interval, or spread())
        self._first = True  # the next step is a fit's first: see _resumed_at
        self._ends: tuple[int | None, bool] = (None, False)  # (epoch index, whether its end saves anyway)
        self._spread: tuple[int, int | None] = (0, None)  # (interval, the epoch's steps if spread) behind _every
        self._agreed: tuple[str, Interval] = ("", Interval(0, "unmeasured"))
        self._after: tuple[float, float, float] | None = None  # after a step checkpoint: (blocked, step time
        # before it, its cost so far), until AFTER_STEPS steps past _saved_at
        if self.shared:
            engine.note_out = self.word
        self._publish()

    def arm(self, now: float) -> None:
        """At the start of a fit (``now``: Unix seconds): the next step compiles; the failures so far are read."""
        self._skip, self._saved_at = True, 0
        self._first, self._ends = True, (None, False)
        if self._after is not None:  # the last fit's last save: counted so far
            self._close_after()
        if self.on and self.policy.auto:
            history = History(self.cfg, self.engine.log, writes=False)
            try:  # both tiers' copies: a run moved to an empty node keeps the failures seen on the others
                records = history.records()
            except OSError:  # unreadable: the prior stands
                records = []
            self.policy.failures(*failure_rate(with_this_start(records, history.path), now))
            self._publish()

    def word(self, cost: float) -> str:
        """The primary's word carried by a commit that cost ``cost`` so far: the interval with that cost counted
        (as its record will be; compact JSON, no spaces)."""
        policy = self.policy
        if not self._measured:
            policy = replace(policy, saves=[*policy.saves, cost][-SAVES_KEPT:])
        return json.dumps(policy.current().as_dict(), separators=(",", ":"))

    def current(self) -> Interval:
        """The interval in force: the agreed word in a job of several processes, else this process's own."""
        if not self.shared:
            return self.policy.current()
        agreed = self.engine.agreed
        if self._agreed[0] != agreed:  # parsed once per word
            self._agreed = (agreed, _parse(agreed))
        return self._agreed[1]

    def step_end(
        self, step: int, step_s: float, save: Callable[..., Any], *, epoch: int = 0, of: int | None = None
    ) -> None:
        """After step ``step`` of epoch index ``epoch`` (``of`` steps, None if unknown), which took ``step_s``:
        take the step checkpoint if one is due (``auto`` in an epoch whose end saves anyway: :func:`spread`)."""
        if not self.on:
            return
        if self._first:
            self._first = False
            self._resumed_at(step)
        if len(self.engine.records) != self._seen:
            self._observe_saves()
        if self._skip or step <= 1:
            self._skip = False
        else:
            self.policy.observe_step(step_s)
        if step <= self._saved_at:  # a new epoch: its steps count from its beginning
            self._saved_at = 0
            if self._after is not None:  # its first step carries the epoch end, not the save's cost: counted so far
                self._close_after()
        elif self._after is not None:
            self._count_after(step, step_s)
        self._steps += 1
        fresh = self._now.reason == "unmeasured" or (self.shared and self.engine.agreed != self._agreed[0])
        if fresh or self._steps >= REFRESH_STEPS:
            self._publish()  # the moving step time, taken again now and then: a step costs microseconds
        if epoch != self._ends[0]:  # the save rule asked once an epoch, not at every step
            self._ends = (epoch, saves_epoch(self.cfg, epoch + 1))
        key = (self._now.steps, of if of and self.policy.auto and self._ends[1] else None)
        if key != self._spread:  # spread() taken again only when the interval or the epoch's kind moves
            self._spread = key
            every, steps = key
            self._every = self.engine.step_interval["every"] = spread(every, steps) if every and steps else every
        every = self._every
        if every and step - self._saved_at >= every:  # a number N: steps N, 2N, ...; auto: as N moves, too
            if self._after is not None:  # the next save came first: its cost so far
                self._close_after()
            began = time.perf_counter()
            save("steps", background=True)  # written as an epoch's is (CheckpointEngine.save_step)
            blocked = time.perf_counter() - began
            self.policy.observe_save(blocked)  # what it blocked training, all of it; the steps after it below
            if self.policy.step_s is not None:
                self._after = (blocked, self.policy.step_s, 0.0)
            self._measured, self._seen = True, len(self.engine.records)
            self._saved_at, self._skip = step, True
            self._publish()

    def _count_after(self, step: int, step_s: float) -> None:
        """Step ``step``, one of those after a step checkpoint, took ``step_s`` (the first includes the save):
        what it took beyond the step time before the save counts in the save's cost, until :data:`AFTER_STEPS`
        steps have passed."""
        blocked, before, cost = self._after
        self._after = (blocked, before, cost + step_s - before)
        if step - self._saved_at >= AFTER_STEPS:
            self._close_after()

    def _close_after(self) -> None:
        """The window after a step checkpoint closes (its steps counted, or the next save, an epoch or a fit came
        first): the save's cost is revised to what was counted, at least its blocked time."""
        blocked, _, cost = self._after
        self._after = None
        self.policy.revise_save(max(blocked, cost))
        self._publish()

    def _resumed_at(self, step: int) -> None:
        """At a fit's first step: a fit resumed from a step checkpoint counts its steps from that one, and one
        process that has saved nothing yet takes the resumed checkpoint's own save time as the probe's (so a
        relaunch is covered from its first steps, not from its first epoch end; several processes wait for the
        primary's word, which only a commit carries)."""
        resumed = self.engine.resumed
        if resumed is None:
            return
        if resumed.step is not None and step > resumed.step:
            self._saved_at = resumed.step
        if self.policy.auto and not self.shared and not self.policy.saves and resumed.save_duration_s > 0:
            self.policy.observe_save(float(resumed.save_duration_s))

    def _observe_saves(self) -> None:
        """Until a step checkpoint's blocked time is measured: the recorded costs of the commits since the last call
        (snapshot and write; a non-primary's parts are not its to judge), the probe's estimate of it."""
        records = self.engine.records
        for record in records[self._seen :]:
            if not (record.get("part") or self._measured):
                self.policy.observe_save(float(record["snapshot_s"]) + float(record["save_s"]))
        self._seen = len(records)
        self._publish()

    def _publish(self) -> None:
        """The interval in force, taken again; ``stats()["steps"]``: it and why, with the measurements behind it."""
        self._now, self._steps = self.current(), 0
        self.engine.step_interval = {**self._now.as_dict(), "setting": self.policy.setting, "every": self._every}


def _parse(word: str) -> Interval:
    """The interval a primary's word says (:meth:`StepPlan.word`); none (``unmeasured``) if it says none."""
    try:
        said = json.loads(word) if word else {}
    except ValueError:
        said = {}
    if not isinstance(said, dict) or "interval" not in said:
        return Interval(0, "unmeasured")
    fields = (said.get(name) for name in ("seconds", "step_s", "save_s", "mtbf_s"))
    return Interval(int(said["interval"]), str(said.get("reason")), *fields)
