"""Every worker learns at the same step whether any worker must save and stop.

A scheduler's signal (or a near deadline) reaches one worker; under
``MultiWorkerMirroredStrategy`` the others must save at the same step, or the
chief would commit a state its peers never reach and every later collective
would pair different steps. So every ``ckpt_preempt_check`` steps each worker
puts its local flag into one small all-reduce (a ``tf.function`` running
``ReplicaContext.all_reduce`` under the strategy, the same collective
machinery as the gradients; no files): the sum is the same on every worker,
so all of them save at that step or none does.

Under a one-process strategy (``MirroredStrategy`` on several devices, or no
strategy) the flag is already known to the only process: no collective runs
and the answer is the local flag, at every step.

Cost: one collective of one scalar per check (``stats()`` records the time;
``benchmarks/bench_agreement.py`` measures it). A worker that dies between
two collectives leaves the others waiting in the next one until its
``timeout_s`` (or the coordination service's heartbeat) runs out.
"""

from __future__ import annotations

import time
from typing import Any

from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.engine.preempt_control import PreemptionController

DEFAULT_AGREE_TIMEOUT_S = 300.0


class SaveAgreement:
    """Agree, across the workers of ``strategy``, whether any of them asked to save now.

    Call :meth:`step_end` once after every training step on every worker, in
    the same order as the training collectives. Every ``every``-th call runs
    the all-reduce; the calls in between return False without talking.

    Args:
        strategy: The ``tf.distribute`` strategy (None: one process).
        num_workers: How many worker processes share ``strategy`` (1: no collective).
        every: Steps between two agreements (``ckpt_preempt_check``).
        timeout_s: Bound on one agreement collective; a worker that waits
            longer raises :class:`CheckpointError` instead of hanging.
    """

    def __init__(
        self, strategy: Any, num_workers: int, *, every: int = 1, timeout_s: float = DEFAULT_AGREE_TIMEOUT_S
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"ckpt_preempt_check must be an int > 0 (steps); got {every!r}")
        self.strategy = strategy
        self.multi = num_workers > 1
        self.every = every
        self.timeout_s = float(timeout_s)
        self.steps = 0  # calls so far: the same count on every worker (they run in lockstep)
        self.checks = 0
        self.check_s = 0.0
        self._reduce = None

    def step_end(self, local: bool) -> bool:
        """Count one step; True on every worker at once when any worker's ``local`` flag was set.

        ``local`` is this worker's flag (a signal was caught, the deadline is near).
        """
        self.steps += 1
        if not self.multi:
            return bool(local)
        if self.steps % self.every:
            return False  # the flag stays set: the next check carries it
        return self.now(local)

    def now(self, local: bool) -> bool:
        """Agree at once, whatever the step count (every worker must call it at the same point)."""
        if not self.multi:
            return bool(local)
        start = time.perf_counter()
        total = self._sum(1.0 if local else 0.0)
        self.checks += 1
        self.check_s += time.perf_counter() - start
        return total > 0

    def stats(self) -> dict[str, Any]:
        """How many agreements ran and what they cost (seconds, total and mean)."""
        mean = self.check_s / self.checks if self.checks else 0.0
        return {"checks": self.checks, "check_s": round(self.check_s, 6), "check_mean_s": round(mean, 9)}

    def _sum(self, value: float) -> float:
        import tensorflow as tf

        if self._reduce is None:
            self._reduce = self._build()
        try:
            return float(self._reduce(tf.constant(value, tf.float32)))
        except tf.errors.DeadlineExceededError as err:
            raise CheckpointError(
                f"preemption agreement: the other workers did not answer within {self.timeout_s:.0f} s "
                f"(a worker died or stopped calling step_end): {err.message}"
            ) from None

    def _build(self):
        """The collective, traced once: each replica contributes the flag, the sum comes back."""
        import tensorflow as tf

        strategy = self.strategy
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=self.timeout_s)

        def replica_fn(flag):
            ctx = tf.distribute.get_replica_context()
            # identity: a tensor placed on this replica's device (the collective reads its device)
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(flag), options=options)

        @tf.function
        def reduce(flag):
            out = strategy.run(replica_fn, args=(flag,))
            return strategy.experimental_local_results(out)[0]

        return reduce


def make_controller(cfg: Any, engine: Any, strategy: Any, info: Any, log: Any) -> PreemptionController:
    """The :class:`~candle_ckpt.engine.preempt_control.PreemptionController` of one ``tf.distribute`` worker.

    The agreement is a :class:`SaveAgreement` over ``strategy`` every
    ``ckpt_preempt_check`` steps; with several workers the log line names this one.
    """
    agreement = SaveAgreement(strategy, info.num_workers, every=cfg.preempt_check)
    who = f"worker {info.task_type}:{info.task_id} " if info.num_workers > 1 else ""
    return PreemptionController(cfg, engine, log, agreement=agreement, who=who)
