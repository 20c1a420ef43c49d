"""What the storage and engine layers know of "several processes": a :class:`Group`.

A group is the processes of one job that write one checkpoint together. Rank 0
is the primary: it holds the writer lock, decides, commits and prunes. The
others write their parts into the same ``work/`` and wait for its word.

Four meeting points are enough for the commit and the restore, none of them a
device collective (so a writer thread may use them):

- :meth:`Group.barrier`: every rank waits until all have arrived;
- :meth:`Group.broadcast`: every rank gets the primary's string;
- :meth:`Group.all_agree`: every rank gets True iff every rank said ok;
- :meth:`Group.exchange`: every rank gets every rank's string (a preemption
  request carries its reason this way).

Each meeting point has a ``name`` unique in the job's life (e.g.
``"save/3/parts-written"``) and a timeout; a rank that does not come in time
raises :class:`~candle_ckpt.core.errors.GroupTimeout` naming the point.

:data:`SOLO` is the one-process group (every call returns at once).
:class:`ThreadGroup` runs N ranks as threads of one process, for tests; the
JAX group over the coordination service lives in the adapter layer.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from candle_ckpt.core.errors import GroupTimeout


@runtime_checkable
class Group(Protocol):
    """The processes of one job, as the checkpoint commit and restore see them."""

    rank: int
    size: int

    def barrier(self, name: str, timeout_s: float) -> None:
        """Return once every rank has called ``barrier(name)``; raise GroupTimeout after ``timeout_s``."""

    def broadcast(self, name: str, value: str | None, timeout_s: float) -> str:
        """Return rank 0's ``value`` (the others pass None) on every rank."""

    def all_agree(self, name: str, ok: bool, timeout_s: float) -> bool:
        """Return True on every rank iff every rank passed ``ok=True``."""

    def exchange(self, name: str, value: str, timeout_s: float) -> list[str]:
        """Return every rank's ``value``, in rank order, on every rank (e.g. why each could not go on)."""


class _Solo:
    """The group of a single process: rank 0 of 1."""

    rank = 0
    size = 1

    def barrier(self, name: str, timeout_s: float) -> None:
        """Nothing to wait for."""

    def broadcast(self, name: str, value: str | None, timeout_s: float) -> str:
        if value is None:
            raise ValueError(f"broadcast {name!r}: the primary must pass a value")
        return value

    def all_agree(self, name: str, ok: bool, timeout_s: float) -> bool:
        return bool(ok)

    def exchange(self, name: str, value: str, timeout_s: float) -> list[str]:
        return [value]

    def __repr__(self) -> str:
        return "SOLO"


SOLO: Group = _Solo()


def is_primary(group: Group) -> bool:
    """True on rank 0, the process that holds the lock and commits."""
    return group.rank == 0


class ThreadGroup:
    """``size`` ranks that are threads of this process (tests): ``ThreadGroup(2).members``.

    Each member is a :class:`Group`. A rank that never calls a meeting point
    (a thread that "crashed") makes the others raise GroupTimeout naming it.
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size must be an int >= 1; got {size!r}")
        self.size = size
        self._cond = threading.Condition()
        self._arrived: dict[str, dict[int, object]] = {}
        self.members = tuple(ThreadMember(self, rank) for rank in range(size))

    def _meet(self, name: str, rank: int, value: object, timeout_s: float, need: set[int]) -> dict[int, object]:
        """Record ``value`` for ``rank`` at ``name``; wait until the ranks in ``need`` have come."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            seen = self._arrived.setdefault(name, {})
            if rank in seen:
                raise ValueError(f"rank {rank} came to {name!r} twice: meeting point names must be unique")
            seen[rank] = value
            self._cond.notify_all()
            while not need <= seen.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GroupTimeout(name, timeout_s, tuple(sorted(need - seen.keys())))
                self._cond.wait(left)
            return dict(seen)


class ThreadMember:
    """One rank of a :class:`ThreadGroup`."""

    def __init__(self, hub: ThreadGroup, rank: int) -> None:
        self.hub = hub
        self.rank = rank
        self.size = hub.size

    def barrier(self, name: str, timeout_s: float) -> None:
        self.hub._meet(name, self.rank, None, timeout_s, set(range(self.size)))

    def broadcast(self, name: str, value: str | None, timeout_s: float) -> str:
        if self.rank == 0 and value is None:
            raise ValueError(f"broadcast {name!r}: the primary must pass a value")
        seen = self.hub._meet(name, self.rank, value, timeout_s, {0})
        return str(seen[0])

    def all_agree(self, name: str, ok: bool, timeout_s: float) -> bool:
        seen = self.hub._meet(name, self.rank, bool(ok), timeout_s, set(range(self.size)))
        return all(seen.values())

    def exchange(self, name: str, value: str, timeout_s: float) -> list[str]:
        seen = self.hub._meet(name, self.rank, str(value), timeout_s, set(range(self.size)))
        return [str(seen[rank]) for rank in range(self.size)]

    def __repr__(self) -> str:
        return f"ThreadMember(rank={self.rank}, size={self.size})"


__all__ = ["SOLO", "Group", "ThreadGroup", "ThreadMember", "is_primary"]
