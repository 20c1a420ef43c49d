"""What the storage and engine layers know of "several processes": a :class:`Group`.

A group is the processes of one job that write one checkpoint together. Rank 0
is the primary: it holds the writer lock, decides, commits and prunes. The
others write their parts into the same ``work/`` and wait for its word.

Five meeting points are enough for the commit and the restore, none of them a
device collective (so a writer thread may use them):

- :meth:`Group.barrier`: every rank waits until all have arrived;
- :meth:`Group.broadcast`: every rank gets the primary's string;
- :meth:`Group.all_agree`: every rank gets True iff every rank said ok;
- :meth:`Group.exchange`: every rank gets every rank's string (a preemption
  request carries its reason this way);
- :meth:`Group.collect`: the primary alone gets every rank's string, and says
  what it decided with a :meth:`Group.broadcast` of the same name (what each
  process of a node-local job holds, at a restore).

Besides the meetings, one word any rank may say to all, with no meeting:
:meth:`Group.notice` (the first rank to say it wins) and :meth:`Group.heard`
(wait for it): the preemption notice (:mod:`candle_ckpt.engine.notice`).

Each meeting point has a ``name`` unique in the group's life (e.g.
``"save/3/parts-written"``; :meth:`Group.meeting` hands out the next one of a
kind) and a timeout; a rank that does not come in time raises
:class:`~candle_ckpt.core.errors.GroupTimeout` naming the point and the ranks
that never came.

Every multi-process group is a :class:`~candle_ckpt.core.store_group.StoreGroup` over a
key-value store (:class:`KVStore`: the JAX coordination service, TensorFlow's, or
memory for ranks that are threads, :mod:`candle_ckpt.testing.groups`); what
each meeting costs is said there.

Rank 0 is the primary, and this module is the one place that says so
(:func:`is_primary`, :func:`is_primary_rank`): no other module compares a rank with 0
(``tests/unit/test_architecture.py``).

:data:`SOLO` is the one-process group (every call returns at once).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

ROOT = "candle_ckpt"


@runtime_checkable
class Group(Protocol):
    """The processes of one job, as the checkpoint commit, the restore and the preemption agreement see them."""

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

    def collect(self, name: str, value: str, timeout_s: float) -> list[str] | None:
        """Every rank's ``value``, in rank order, on the primary; None on the others (no outcome: the primary
        decides and says its word with :meth:`broadcast` under the same ``name``)."""

    def notice(self, name: str, value: str) -> bool:
        """Say ``value`` under ``name`` to every rank, once for the group: False if a rank said it first."""

    def heard(self, name: str, timeout_s: float) -> str | None:
        """What was said under ``name`` (:meth:`notice`), waiting up to ``timeout_s``; None if nothing yet."""

    def meeting(self, kind: str) -> str:
        """The next meeting point prefix of ``kind`` in this group (``save/0``, ``save/1``...): same on every rank."""

    def lane(self, name: str) -> Group:
        """A view of this group whose meetings (named under ``name``) run on another thread, with their own cleanup."""

    def close(self, timeout_s: float) -> bool:
        """Last meeting of this group: every key of ours is deleted; False (never raises) if a rank did not come."""


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

    def collect(self, name: str, value: str, timeout_s: float) -> list[str] | None:
        return [value]

    def meeting(self, kind: str) -> str:
        return f"{kind}/0"  # nothing is stored: names need not differ

    def notice(self, name: str, value: str) -> bool:
        return True  # no one else to tell

    def heard(self, name: str, timeout_s: float) -> str | None:
        return None  # nothing is kept: a group of one hears only itself, at once

    def lane(self, name: str) -> Group:
        return self

    def close(self, timeout_s: float) -> bool:
        return True

    def __repr__(self) -> str:
        return "SOLO"


SOLO: Group = _Solo()


def is_primary(group: Group) -> bool:
    """True on rank 0, the process that holds the lock and commits."""
    return is_primary_rank(group.rank)


def is_primary_rank(rank: int) -> bool:
    """True for rank 0, the primary (a rank read from a file, e.g. the part a node-local sidecar names)."""
    return rank == 0


class KVStore(Protocol):
    """The key-value store a :class:`StoreGroup` meets through (a coordination service's, or memory)."""

    def set(self, key: str, value: str) -> bool:
        """Insert ``key`` unless it exists; False when it does (the first writer wins)."""

    def get(self, key: str, timeout_s: float) -> str | None:
        """``key``'s value once someone set it, or None after ``timeout_s``."""

    def delete(self, key: str) -> None:
        """Delete ``key`` and every key below ``key/`` (no error if none exists)."""

    def increment(self, key: str) -> int:
        """Add one to the counter ``key`` (0 when new) and return the new value, atomically."""

    def keys(self, prefix: str) -> list[str] | None:
        """Every key below ``prefix`` (for tests and the benchmark), or None if the store cannot list."""


def scoped(group: Group, purpose: str) -> Group:
    """A fresh group of the same ranks for one ``fit`` / ``restart()`` / ``train()`` (``purpose`` names it).

    A group over a store opens it (:meth:`~candle_ckpt.core.store_group.StoreGroup.scope`: its keys below
    ``candle_ckpt/<n>-<purpose>/``, so that a scope never meets keys an earlier one left); a group that keeps
    nothing (:data:`SOLO`) is its own scope. No module-level counter: two callbacks, or a fit after a fit, in
    one process each get their own.
    """
    scope = getattr(group, "scope", None)
    return scope(purpose) if scope is not None else group


__all__ = ["ROOT", "SOLO", "Group", "KVStore", "is_primary", "is_primary_rank", "scoped"]
