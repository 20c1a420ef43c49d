"""Test doubles of :mod:`candle_ckpt.core.group`: ranks that are threads of one process, meeting in memory.

:class:`ThreadGroup` gives ``size`` :class:`~candle_ckpt.core.store_group.StoreGroup` members over one
:class:`MemoryStore`: the same protocol, the same keys and the same call counts as processes over a coordination
service, in milliseconds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from candle_ckpt.core.store_group import StoreGroup


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


__all__ = ["MemoryStore", "ThreadGroup"]
