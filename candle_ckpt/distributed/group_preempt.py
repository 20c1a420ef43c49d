"""Every process of a group learns at the same step whether any of them must save and stop.

A signal (or a near deadline) reaches one process of a multi-process JAX job;
the others must save the same step, or the primary would wait for parts that
never come. :class:`GroupPreemptAgreement` is the ``agree`` hook of
:class:`~candle_ckpt.keras.preemption.FitPreemption`: every
``ckpt_preempt_check`` steps each process posts its request (a reason, or
nothing) to the group's key-value store and reads every other's; the first
rank's reason is what the processes that did not ask record (a group without
``exchange`` records ``peer`` there), and every process saves the same step.
No device collective runs: one small exchange through the coordination service
(about a millisecond on one machine).

A peer that died stops the others at the next exchange: they raise
:class:`~candle_ckpt.core.errors.GroupTimeout` after ``timeout_s``, naming the
rank that never came (or the JAX coordination service ends them first, when
its heartbeat notices the dead peer).
"""

from __future__ import annotations

import time

from candle_ckpt.core.group import Group
from candle_ckpt.engine.group_commit import group_timeout, meeting
from candle_ckpt.engine.preempt import Trigger


class GroupPreemptAgreement:
    """Called with this process's request (or None) at every decision; returns the group's, the same on all.

    Args:
        group: The job's processes (JAX: :class:`~candle_ckpt.distributed.jax_group.JaxGroup`).
        every: Decisions between two exchanges (``ckpt_preempt_check``); the ones between return None.
        timeout_s: Bound on one exchange (None: :func:`~candle_ckpt.engine.group_commit.group_timeout`).
        prefix: Names this agreement's exchanges (``prefix/N``); by default the next ``preempt/K`` of this
            process, the same on every process since each makes its agreements in the same order.
    """

    def __init__(self, group: Group, every: int = 1, timeout_s: float | None = None, prefix: str | None = None) -> None:
        self.group = group
        self.prefix = meeting("preempt") if prefix is None else prefix
        self.every = max(1, int(every))
        self.timeout_s = group_timeout() if timeout_s is None else timeout_s
        self.calls = 0
        self.seconds = 0.0  # time spent in exchanges, for stats

    def __call__(self, trigger: Trigger | None) -> Trigger | None:
        self.calls += 1
        if self.calls % self.every:
            return None
        start = time.perf_counter()
        name = f"{self.prefix}/{self.calls}"
        mine = trigger.reason if trigger is not None else ""
        reasons = self._exchange(name, mine)
        self.seconds += time.perf_counter() - start
        first = next((r for r in reasons if r), None)
        if first is None:
            return None
        if trigger is not None:  # this process asked: its own request (all save now either way)
            return trigger
        return Trigger(first, None, time.monotonic(), time.time())

    def _exchange(self, name: str, mine: str) -> list[str]:
        """Every rank's request at ``name``, in rank order (a group without ``exchange``: the first one only)."""
        group = self.group
        gather = getattr(group, "exchange", None)
        if gather is not None:
            return gather(name, mine, self.timeout_s)
        if group.all_agree(f"{name}/quiet", not mine, self.timeout_s):
            return []
        return [group.broadcast(f"{name}/reason", (mine or "peer") if group.rank == 0 else None, self.timeout_s)]
