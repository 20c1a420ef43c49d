"""The processes of a multi-process JAX job as a :class:`~candle_ckpt.core.group.Group`.

Roles come from JAX: ``jax.process_index()`` is the rank (0 is the primary: it
holds the writer lock, decides, commits and prunes), ``jax.process_count()``
the size. The meeting points run over the JAX coordination service's
key-value store (the service ``jax.distributed.initialize()`` started), never
over device collectives, so a background thread may use them while the
training thread runs the next steps. :class:`~candle_ckpt.core.group.StoreGroup`
holds the protocol (O(N) messages per meeting, every key deleted once it has
served); :class:`JaxStore` is the store.

JAX has no public handle on that service's client: :func:`coordination_client`
is the one place that reaches into ``jax._src.distributed`` for it
(``tests/unit/distributed/test_jax_group.py`` fails loudly if it moves, and
pins the client calls used here: ``key_value_set`` refuses an existing key
unless told to overwrite, ``key_value_delete`` deletes a key's subtree,
``blocking_key_value_get`` times out with ``DEADLINE_EXCEEDED``).
"""

from __future__ import annotations

import sys
from typing import Any

from candle_ckpt.core.group import SOLO, Group
from candle_ckpt.core.store_group import ServiceStore, StoreGroup


def coordination_client() -> Any:
    """The JAX coordination service client of this process, or None outside ``jax.distributed``.

    The only access to private JAX in candle_ckpt (see the module docstring).
    """
    jax_mod = sys.modules.get("jax")
    if jax_mod is None:
        return None
    from jax._src import distributed  # noqa: PLC0415 (private: the one gateway)

    return getattr(distributed.global_state, "client", None)


def process_place() -> tuple[int, int]:
    """``(jax.process_index(), jax.process_count())``; ``(0, 1)`` where JAX is not imported."""
    jax_mod = sys.modules.get("jax")
    if jax_mod is None:
        return 0, 1
    return int(jax_mod.process_index()), int(jax_mod.process_count())


class JaxStore(ServiceStore):
    """A :class:`~candle_ckpt.core.group.KVStore` over the JAX coordination client (one call per method call)."""

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = client

    def _insert(self, key: str, value: str) -> None:
        self.client.key_value_set(key, value)

    def _read(self, key: str, timeout_ms: int) -> str:
        return self.client.blocking_key_value_get(key, timeout_ms)

    def _delete(self, key: str) -> None:
        self.client.key_value_delete(key)

    def increment(self, key: str) -> int:
        self.count("increment")
        return int(self.client.key_value_increment(key, 1))

    def keys(self, prefix: str) -> list[str]:
        self.count("dir")
        return sorted(k for k, _ in self.client.key_value_dir_get(prefix))


def jax_group() -> Group:
    """This process's group when JAX runs several processes (``jax.distributed``), else :data:`SOLO`."""
    rank, size = process_place()
    if size <= 1:
        return SOLO
    client = coordination_client()
    if client is None:
        return SOLO
    return StoreGroup(JaxStore(client), rank, size)
