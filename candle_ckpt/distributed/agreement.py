"""Every worker of a ``tf.distribute`` job learns at the same step whether any worker must save and stop.

A scheduler's signal (or a near deadline) reaches one worker; under
``MultiWorkerMirroredStrategy`` the others must save at the same step, or the
chief would commit a state its peers never reach and every later collective
would pair different steps.

The workers are a :class:`~candle_ckpt.core.group.Group` over TensorFlow's
coordination service (:mod:`candle_ckpt.distributed.tf_group`), and the
agreement is :class:`~candle_ckpt.engine.preempt_control.NoticeAgreement`, the
same as for JAX processes: nothing is said on a step unless a worker asked
(a watcher thread per worker blocks on one key, as in TensorFlow's own
``PreemptionCheckpointHandler``); then the workers agree once on one step
``S`` (the max of their steps + 1) and all save it. No collective runs per
step (``benchmarks/bench_agreement.py`` measures the per-step cost: a counter
increment and a flag read). A worker that dies makes the others raise
:class:`~candle_ckpt.core.errors.GroupTimeout` naming it once the agreement's
bound runs out.

Under a one-process strategy (``MirroredStrategy`` on several devices, or no
strategy) the group is ``SOLO``: the local flag is the answer at every step.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.core.group import scoped
from candle_ckpt.distributed.tf_group import tf_group
from candle_ckpt.engine.group_commit import group_timeout
from candle_ckpt.engine.preempt_control import NoticeAgreement, PreemptionController


def make_controller(cfg: Any, engine: Any, strategy: Any, info: Any, log: Any) -> PreemptionController:
    """The :class:`~candle_ckpt.engine.preempt_control.PreemptionController` of one ``tf.distribute`` worker.

    The agreement is a :class:`NoticeAgreement` over this fit's scope of the workers' group
    (:func:`~candle_ckpt.core.group.scoped`); with several workers the log line names this one.
    """
    group = tf_group(strategy, info.num_workers)
    agreement = NoticeAgreement(scoped(group, "fit") if group.size > 1 else group, timeout_s=group_timeout())
    who = f"worker {info.task_type}:{info.task_id} " if info.num_workers > 1 else ""
    return PreemptionController(cfg, engine, log, agreement=agreement, who=who)
