"""The processes of a multi-process JAX job as a :class:`~candle_ckpt.core.group.Group`.

Roles come from JAX: ``jax.process_index()`` is the rank (0 is the primary: it
holds the writer lock, decides, commits and prunes), ``jax.process_count()``
the size. The meeting points run over the JAX coordination service's
key-value store and barriers (the service ``jax.distributed.initialize()``
started), never over device collectives, so a background writer thread may
use them while the training thread runs the next steps.

JAX has no public handle on that service's client: :func:`coordination_client`
is the one place that reaches into ``jax._src.distributed`` for it
(``tests/unit/distributed/test_jax_group.py`` fails loudly if it moves).

Every wait is bounded: a peer that does not come within ``timeout_s`` makes
the waiting process raise :class:`~candle_ckpt.core.errors.GroupTimeout`
naming the meeting point and, where it can tell, the ranks that never came.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from candle_ckpt.core.errors import GroupTimeout

_PREFIX = "candle_ckpt/"
_POLL_S = 0.005


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


class JaxGroup:
    """A :class:`~candle_ckpt.core.group.Group` over the JAX coordination service.

    Args:
        client: The coordination client (:func:`coordination_client`).
        rank: This process's index (``jax.process_index()``).
        size: The number of processes (``jax.process_count()``).
    """

    def __init__(self, client: Any, rank: int, size: int) -> None:
        self.client = client
        self.rank = rank
        self.size = size

    def __repr__(self) -> str:
        return f"JaxGroup(rank={self.rank}, size={self.size})"

    def _key(self, name: str, rank: int) -> str:
        return f"{_PREFIX}{name}/{rank}"

    def _get(self, name: str, rank: int, deadline: float, timeout_s: float) -> str:
        """The value rank ``rank`` posted at ``name``; GroupTimeout naming both once ``deadline`` passes."""
        key = self._key(name, rank)
        while True:
            left = deadline - time.monotonic()
            try:
                # Short waits, so that a dead peer is noticed by our deadline, not by the service's.
                return str(self.client.blocking_key_value_get(key, int(max(1, min(left, 1.0)) * 1000)))
            except Exception as err:  # DEADLINE_EXCEEDED: not posted yet; anything else: the service is gone
                if "DEADLINE_EXCEEDED" not in str(err) and "timed out" not in str(err).lower():
                    raise GroupTimeout(name, timeout_s, (rank,)) from err
            if time.monotonic() >= deadline:
                raise GroupTimeout(name, timeout_s, (rank,))

    def _post(self, name: str, value: str) -> None:
        self.client.key_value_set(self._key(name, self.rank), value)

    def barrier(self, name: str, timeout_s: float) -> None:
        """Return once every rank has reached ``name``; GroupTimeout (naming the ranks missing) otherwise."""
        self.all_agree(name, True, timeout_s)

    def broadcast(self, name: str, value: str | None, timeout_s: float) -> str:
        """Rank 0's ``value`` on every rank (rank 0 must pass one)."""
        if self.rank == 0:
            if value is None:
                raise ValueError(f"broadcast {name!r}: the primary must pass a value")
            self._post(name, value)
            return value
        return self._get(name, 0, time.monotonic() + timeout_s, timeout_s)

    def all_agree(self, name: str, ok: bool, timeout_s: float) -> bool:
        """True on every rank iff every rank passed ``ok=True``; every rank waits for all the others."""
        return all(v == "1" for v in self.exchange(name, "1" if ok else "0", timeout_s))

    def exchange(self, name: str, value: str, timeout_s: float) -> list[str]:
        """Every rank's ``value`` at ``name``, in rank order (each rank posts, then reads all the others)."""
        self._post(name, value)
        deadline = time.monotonic() + timeout_s
        values, missing = [], []
        for rank in range(self.size):
            if rank == self.rank:
                values.append(value)
                continue
            try:
                values.append(self._get(name, rank, deadline, timeout_s))
            except GroupTimeout:
                missing.append(rank)
        if missing:
            raise GroupTimeout(name, timeout_s, tuple(missing))
        return values


def jax_group() -> JaxGroup | None:
    """This process's group when JAX runs several processes (``jax.distributed``), else None."""
    rank, size = process_place()
    if size <= 1:
        return None
    client = coordination_client()
    if client is None:
        return None
    return JaxGroup(client, rank, size)
