"""The workers of a ``MultiWorkerMirroredStrategy`` job as a :class:`~candle_ckpt.core.group.Group`.

The strategy starts TensorFlow's coordination service (the one its own
``PreemptionCheckpointHandler`` meets through); :class:`TfStore` is that
service's key-value store, reached through ``context.context()``'s
``set_config_key_value`` / ``get_config_key_value`` / ``delete_config_key_value``.
The protocol is :class:`~candle_ckpt.core.group.StoreGroup`'s, the same as
for JAX: O(N) messages per meeting, every key deleted once it has served, no
device collective (so a watcher thread may use it while the training thread
runs its all-reduces).

The rank is TensorFlow's ``multi_worker_util.id_in_cluster`` (the chief is 0).
"""

from __future__ import annotations

import time
from typing import Any

from candle_ckpt.core.group import SOLO, CallCount, Group, StoreGroup


def _context() -> Any:
    from tensorflow.python.eager import context  # noqa: PLC0415 (the coordination service's only handle)

    return context.context()


class TfStore(CallCount):
    """A :class:`~candle_ckpt.core.group.KVStore` over TensorFlow's coordination service (one call per call)."""

    def set(self, key: str, value: str) -> bool:
        self.count("set")
        try:
            _context().set_config_key_value(key, value)
        except Exception as err:
            if "already exists" in str(err).lower() or type(err).__name__ == "AlreadyExistsError":
                return False
            raise
        return True

    def get(self, key: str, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            self.count("get")
            try:  # a timeout of 0 would wait forever: at least 1 ms
                return str(_context().get_config_key_value(key, max(1, int(min(left, 30.0) * 1000))))
            except Exception as err:  # DEADLINE_EXCEEDED: not set yet; anything else: the service is gone
                if type(err).__name__ != "DeadlineExceededError" and "timed out" not in str(err).lower():
                    return None
            if time.monotonic() >= deadline:
                return None

    def delete(self, key: str) -> None:
        self.count("delete")
        _context().delete_config_key_value(key)

    def increment(self, key: str) -> int:
        # Each rank increments only its own counter (core.group.scoped), so read-delete-set cannot race.
        value = int(self.get(key, 0.001) or 0) + 1
        self.delete(key)
        self.set(key, str(value))
        return value

    def keys(self, prefix: str) -> None:
        return None  # the service has no listing call in TensorFlow's Python API


def tf_group(strategy: Any, num_workers: int) -> Group:
    """The group of ``strategy``'s workers (several), else :data:`SOLO`."""
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    if num_workers <= 1 or resolver is None or getattr(resolver, "task_type", None) is None:
        return SOLO
    from tensorflow.python.distribute import multi_worker_util  # noqa: PLC0415

    spec = resolver.cluster_spec().as_dict()
    rank = multi_worker_util.id_in_cluster(spec, resolver.task_type, int(resolver.task_id or 0))
    return StoreGroup(TfStore(), rank, num_workers)
