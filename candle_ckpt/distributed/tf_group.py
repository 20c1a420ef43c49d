"""The workers of a ``MultiWorkerMirroredStrategy`` job as a :class:`~candle_ckpt.core.group.Group`.

The strategy starts TensorFlow's coordination service (the one its own
``PreemptionCheckpointHandler`` meets through); :class:`TfStore` is that
service's key-value store, reached through ``context.context()``'s
``set_config_key_value`` / ``get_config_key_value`` / ``delete_config_key_value``
(:func:`~candle_ckpt.distributed.tf_internals.coordination_context`: TensorFlow's private
modules are reached only there).
The protocol is :class:`~candle_ckpt.core.group.StoreGroup`'s, the same as
for JAX: O(N) messages per meeting, every key deleted once it has served, no
device collective (so a watcher thread may use it while the training thread
runs its all-reduces).

The rank is TensorFlow's ``multi_worker_util.id_in_cluster`` (the chief is 0), through the same gateway.

A worker's preemption agreement is the one every group has
(:class:`~candle_ckpt.engine.notice.NoticeAgreement`, built by
:class:`~candle_ckpt.engine.run.TrainingRun` over this group): nothing is said
on a step unless a worker asked (a watcher thread per worker blocks on one key,
as in TensorFlow's own ``PreemptionCheckpointHandler``); then the workers agree
once on one step and all save it. Under a one-process strategy the group is
``SOLO``: the local flag is the answer at every step.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.core.errors import GroupTimeout
from candle_ckpt.core.group import SOLO, Group
from candle_ckpt.core.store_group import ServiceStore, StoreGroup
from candle_ckpt.distributed.tf_internals import coordination_context, worker_rank

COUNTER_READ_S = 60.0  # the read of a counter known to exist (only a dead service makes it wait)


class TfStore(ServiceStore):
    """A :class:`~candle_ckpt.core.group.KVStore` over TensorFlow's coordination service (one call per call)."""

    def _insert(self, key: str, value: str) -> None:
        coordination_context().set_config_key_value(key, value)

    def _read(self, key: str, timeout_ms: int) -> str:
        return coordination_context().get_config_key_value(key, timeout_ms)

    def _delete(self, key: str) -> None:
        coordination_context().delete_config_key_value(key)

    def increment(self, key: str) -> int:
        # Each rank increments only its own counter (core.group.scoped), so read-delete-set cannot race. Whether
        # the counter exists is asked by inserting it, never by a short read: a read that times out on a busy
        # machine would take an existing counter for a new one, and this rank's next scope would not be the
        # others' (their meetings then wait for each other under two names until the bound).
        if self.set(key, "1"):
            return 1
        got = self.get(key, COUNTER_READ_S)  # it exists: the read returns at once
        if got is None:
            raise GroupTimeout(key, COUNTER_READ_S)
        value = int(got) + 1
        self.delete(key)
        self.set(key, str(value))
        return value

    def keys(self, prefix: str) -> None:
        return None  # the service has no listing call in TensorFlow's Python API


def tf_group(strategy: Any, num_workers: int) -> Group:
    """The group of ``strategy``'s workers (several), else :data:`SOLO`; the chief is rank 0 (the rank is
    :func:`~candle_ckpt.distributed.tf_internals.worker_rank`'s, as TensorFlow's own
    ``PreemptionCheckpointHandler`` numbers the workers)."""
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    if num_workers <= 1 or resolver is None or getattr(resolver, "task_type", None) is None:
        return SOLO
    rank = worker_rank(resolver.cluster_spec().as_dict(), resolver.task_type, int(resolver.task_id or 0))
    return StoreGroup(TfStore(), rank, num_workers)
