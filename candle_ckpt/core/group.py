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

Every multi-process group is a :class:`StoreGroup` over a key-value store (the
JAX coordination service, TensorFlow's, or :class:`MemoryStore` for ranks that
are threads: :class:`ThreadGroup`). Its cost, for ``N`` ranks and one meeting:

- a gathering meeting (barrier, all_agree, exchange): each other rank posts one
  key, the primary reads the ``N - 1`` posts and deletes them (one call),
  posts one outcome, and each other rank reads it once: about ``3N`` calls in
  all, never ``N - 1`` reads on every rank;
- a broadcast: one post, ``N - 1`` reads.

The store stays bounded: an outcome is deleted by the primary at the next
gathering meeting of the same :meth:`Group.lane` (every rank's post to it
proves that rank read the outcome), and :meth:`Group.close` (a last gathering
meeting) deletes what is left. At any moment a lane holds at most its last
gathering meeting's ``N`` posts and the outcomes since, a small constant.

:data:`SOLO` is the one-process group (every call returns at once).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from candle_ckpt.core.errors import GroupTimeout

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
    return group.rank == 0


def _next(seq: Counter[str], kind: str) -> int:
    n = seq[kind]
    seq[kind] += 1
    return n


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


class CallCount:
    """Every call a store makes to its service, by operation and by thread name (tests and benchmarks read them)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.by_thread: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def count(self, op: str) -> None:
        with self._count_lock:
            self.calls[op] += 1
            self.by_thread[threading.current_thread().name] += 1


def read_until(read: Callable[[float], str], timeout_s: float, chunk_s: float = 30.0) -> str | None:
    """A coordination service's blocking read, ``read(seconds)``, repeated in chunks until ``timeout_s`` passes.

    Returns the value, or None once the time is up, or at once when the read fails otherwise (the service is
    gone: the caller names the rank it waited for).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return str(read(max(0.001, min(left, chunk_s))))
        except Exception as err:  # DEADLINE_EXCEEDED (JAX), DeadlineExceededError (TensorFlow): not set yet
            said = f"{type(err).__name__} {err}"
            if "DEADLINE_EXCEEDED" not in said and "DeadlineExceeded" not in said and "timed out" not in said:
                return None
        if time.monotonic() >= deadline:
            return None


class ServiceStore(CallCount):
    """A :class:`KVStore` over a coordination service's client: a subclass gives the three raw calls.

    ``_insert(key, value)`` raises when the key exists (its error says "already exists" in some spelling);
    ``_read(key, ms)`` blocks at most ``ms`` and raises a deadline error; ``_delete(key)`` deletes the subtree.
    Every call is counted (:class:`CallCount`).
    """

    def _insert(self, key: str, value: str) -> None:
        raise NotImplementedError

    def _read(self, key: str, timeout_ms: int) -> str:
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError

    def set(self, key: str, value: str) -> bool:
        self.count("set")
        try:
            self._insert(key, value)
        except Exception as err:  # ALREADY_EXISTS (JAX), AlreadyExistsError (TensorFlow): the first writer won
            if "already" in f"{type(err).__name__} {err}".lower().replace("_", " "):
                return False
            raise
        return True

    def get(self, key: str, timeout_s: float) -> str | None:
        def read(seconds: float) -> str:
            self.count("get")
            return self._read(key, max(1, int(seconds * 1000)))  # at least 1 ms: 0 waits forever in TensorFlow

        return read_until(read, timeout_s)

    def delete(self, key: str) -> None:
        self.count("delete")
        self._delete(key)


class MemoryStore:
    """A :class:`KVStore` in this process's memory (ranks that are threads); counts every call in :attr:`calls`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._data: dict[str, str] = {}
        self.calls: Counter[str] = Counter()

    def set(self, key: str, value: str) -> bool:
        with self._cond:
            self.calls["set"] += 1
            if key in self._data:
                return False
            self._data[key] = value
            self._cond.notify_all()
            return True

    def get(self, key: str, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.calls["get"] += 1
            while key not in self._data:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._data[key]

    def delete(self, key: str) -> None:
        with self._cond:
            self.calls["delete"] += 1
            for k in [k for k in self._data if k == key or k.startswith(key + "/")]:
                del self._data[k]

    def increment(self, key: str) -> int:
        with self._cond:
            self.calls["increment"] += 1
            value = int(self._data.get(key, "0")) + 1
            self._data[key] = str(value)
            return value

    def keys(self, prefix: str) -> list[str]:
        with self._cond:
            return sorted(k for k in self._data if k.startswith(prefix))


_TIMEOUT = "!timeout:"


class StoreGroup:
    """A :class:`Group` over a :class:`KVStore` (the module docstring says what each meeting costs).

    Args:
        store: Where the ranks meet.
        rank: This process's rank (0: the primary).
        size: How many ranks.
        prefix: Every key of this group is below ``prefix/`` (the ranks must agree on it).
    """

    def __init__(self, store: KVStore, rank: int, size: int, prefix: str = ROOT) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}); got {rank!r}")
        self.store, self.rank, self.size, self.prefix = store, rank, size, prefix.rstrip("/")
        self._seq: Counter[str] = Counter()
        self._served: list[str] = []  # outcomes every rank may still read: deleted at the next gathering meeting

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, prefix={self.prefix!r})"

    def _key(self, name: str, leaf: str) -> str:
        return f"{self.prefix}/{name}/{leaf}"

    def meeting(self, kind: str) -> str:
        return f"{kind}/{_next(self._seq, kind)}"

    def notice(self, name: str, value: str) -> bool:
        return self.store.set(f"{self.prefix}/{name}", value)

    def heard(self, name: str, timeout_s: float) -> str | None:
        return self.store.get(f"{self.prefix}/{name}", timeout_s)

    def lane(self, name: str) -> StoreGroup:
        return StoreGroup(self.store, self.rank, self.size, f"{self.prefix}/{name}")

    def _post(self, key: str, value: str, name: str) -> None:
        if not self.store.set(key, value):
            raise ValueError(f"{key!r} is already set: meeting point {name!r} came twice (names must be unique)")

    def _outcome(self, name: str, value: str) -> None:
        """The primary's word at ``name``, read once by every other rank (deleted at the next gathering)."""
        key = self._key(name, "out")
        self._post(key, value, name)
        self._served.append(key)

    def _read_outcome(self, name: str, timeout_s: float) -> str:
        # A little longer than the primary waits, so that a primary that timed out can say who is missing.
        value = self.store.get(self._key(name, "out"), timeout_s * 1.1 + 1.0)
        if value is None:
            raise GroupTimeout(name, timeout_s, (0,))
        if value.startswith(_TIMEOUT):
            raise GroupTimeout(name, timeout_s, tuple(int(r) for r in value[len(_TIMEOUT) :].split(",")))
        return value

    def _gather(self, name: str, value: str, timeout_s: float) -> list[str] | None:
        """Every rank's ``value`` on the primary (None on the others, after posting theirs).

        The primary then deletes the posts and the outcomes earlier meetings left (every rank read them
        before posting here); a rank missing at the deadline is named to every rank that came.
        """
        inbox = self._key(name, "in")
        if self.rank != 0:
            self._post(f"{inbox}/{self.rank}", value, name)
            return None
        deadline = time.monotonic() + timeout_s
        values, missing = [value], []
        for rank in range(1, self.size):
            got = self.store.get(f"{inbox}/{rank}", max(deadline - time.monotonic(), 0.001))
            if got is None:
                missing.append(rank)
            values.append(got or "")
        if missing:
            self._outcome(name, _TIMEOUT + ",".join(map(str, missing)))
            raise GroupTimeout(name, timeout_s, tuple(missing))
        self.store.delete(inbox)
        served, self._served = self._served, []
        for key in served:
            self.store.delete(key)
        return values

    def barrier(self, name: str, timeout_s: float) -> None:
        self.all_agree(name, True, timeout_s)

    def broadcast(self, name: str, value: str | None, timeout_s: float) -> str:
        if self.rank != 0:
            return self._read_outcome(name, timeout_s)
        if value is None:
            raise ValueError(f"broadcast {name!r}: the primary must pass a value")
        self._outcome(name, value)
        return value

    def all_agree(self, name: str, ok: bool, timeout_s: float) -> bool:
        values = self._gather(name, "1" if ok else "0", timeout_s)
        if values is None:
            return self._read_outcome(name, timeout_s) == "1"
        agreed = all(v == "1" for v in values)
        self._outcome(name, "1" if agreed else "0")
        return agreed

    def exchange(self, name: str, value: str, timeout_s: float) -> list[str]:
        values = self._gather(name, str(value), timeout_s)
        if values is None:
            return [str(v) for v in json.loads(self._read_outcome(name, timeout_s))]
        self._outcome(name, json.dumps(values))
        return values

    def collect(self, name: str, value: str, timeout_s: float) -> list[str] | None:
        return self._gather(name, str(value), timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Last meeting: the primary gathers every rank (so none will read again) and deletes every key below
        :attr:`prefix` (a scope's or a lane's alone: :func:`scoped`, :meth:`lane`).

        The other ranks post and go on. Returns False if a rank did not come in time (the keys stay: a job
        whose rank died is over).
        """
        name = self.meeting("close")
        try:
            values = self._gather(name, "", timeout_s)
        except GroupTimeout:
            return False
        if values is not None:  # the prefix is this scope's or lane's alone: nothing under it is read again
            self.store.delete(self.prefix)
            self._served.clear()
        return True


def scoped(group: Group, purpose: str) -> Group:
    """A fresh group of the same ranks for one ``fit`` / ``restart()`` / ``train()`` (``purpose`` names it).

    Its keys are below ``candle_ckpt/<n>-<purpose>/``, where ``n`` counts the scopes this rank has opened in
    the job, kept in the store (one counter per rank, the only keys that outlive a scope): every rank opens
    the same scopes in the same order, so all agree on ``n`` with no message, and a scope never meets keys an
    earlier one left (a fit that failed). No module-level counter: two callbacks, or a fit after a fit, in
    one process each get their own.
    """
    if not isinstance(group, StoreGroup):
        return group
    n = group.store.increment(f"{ROOT}/opened/{group.rank}")
    return StoreGroup(group.store, group.rank, group.size, f"{ROOT}/{n}-{purpose}")


class ThreadGroup:
    """``size`` ranks that are threads of this process (tests): ``ThreadGroup(2).members``.

    Each member is a :class:`StoreGroup` over one :class:`MemoryStore` (:attr:`store`). A rank that never
    calls a meeting point (a thread that "crashed") makes the others raise GroupTimeout naming it.
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size must be an int >= 1; got {size!r}")
        self.size = size
        self.store = MemoryStore()
        self.members = tuple(StoreGroup(self.store, rank, size) for rank in range(size))


__all__ = [
    "ROOT",
    "SOLO",
    "CallCount",
    "Group",
    "KVStore",
    "MemoryStore",
    "StoreGroup",
    "ThreadGroup",
    "is_primary",
    "scoped",
]
