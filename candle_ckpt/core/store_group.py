"""A :class:`~candle_ckpt.core.group.Group` over a key-value store: :class:`StoreGroup`, and the coordination
services' stores (:class:`ServiceStore`).

Every multi-process group is a :class:`StoreGroup` over a key-value store (the
JAX coordination service, TensorFlow's, or
:class:`~candle_ckpt.testing.thread_group.MemoryStore` for ranks that are threads:
:class:`~candle_ckpt.testing.thread_group.ThreadGroup`). Its cost, for ``N`` ranks and one meeting:

- a gathering meeting (barrier, all_agree, exchange): each other rank posts one
  key, the primary reads the ``N - 1`` posts and deletes them (one call),
  posts one outcome, and each other rank reads it once: about ``3N`` calls in
  all, never ``N - 1`` reads on every rank;
- a broadcast: one post, ``N - 1`` reads.

The store stays bounded: an outcome is deleted by the primary at the next
gathering meeting of the same :meth:`StoreGroup.lane` (every rank's post to it
proves that rank read the outcome), and :meth:`StoreGroup.close` (a last gathering
meeting) deletes what is left. At any moment a lane holds at most its last
gathering meeting's ``N`` posts and the outcomes since, a small constant.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable

from candle_ckpt.core.errors import GroupTimeout
from candle_ckpt.core.group import ROOT, KVStore, is_primary


def _next(seq: Counter[str], kind: str) -> int:
    n = seq[kind]
    seq[kind] += 1
    return n


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

    def scope(self, purpose: str) -> StoreGroup:
        """A fresh group of the same ranks for one ``fit`` / ``restart()`` / ``train()`` (what
        :func:`~candle_ckpt.core.group.scoped` opens).

        Its keys are below ``candle_ckpt/<n>-<purpose>/``, where ``n`` counts the scopes this rank has opened in
        the job, kept in the store (one counter per rank, the only keys that outlive a scope): every rank opens
        the same scopes in the same order, so all agree on ``n`` with no message, and a scope never meets keys an
        earlier one left (a fit that failed).
        """
        n = self.store.increment(f"{ROOT}/opened/{self.rank}")
        return StoreGroup(self.store, self.rank, self.size, f"{ROOT}/{n}-{purpose}")

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
        if not is_primary(self):
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
        if not is_primary(self):
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


__all__ = ["CallCount", "ServiceStore", "StoreGroup", "read_until"]
