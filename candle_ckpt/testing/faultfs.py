"""A file system that records every step of the store and fails one on demand.

Used by the fault-injection tests of the commit protocol (and usable by anyone
testing code that writes checkpoints): run a save with ``FaultFS()`` to list its
steps, then again with ``FaultFS(fail_at=k)`` for each ``k`` to see that a
failure at that step leaves every earlier checkpoint intact.
"""

from __future__ import annotations

import errno as errno_codes
from collections.abc import Iterable

from candle_ckpt.core.fs import LocalFS


class FaultFS(LocalFS):
    """Records ``(operation, path)`` of every step; raises ``OSError`` at one chosen step, once.

    Args:
        fail_at: Which matching step fails, counted from 1; None never fails.
        kinds: Operation names that count as matching (``"fsync"``, ``"rename"``,
            ...); None counts every step.
        errno: The error number raised (EIO by default; ENOSPC for a full disk).
    """

    def __init__(self, fail_at: int | None = None, kinds: Iterable[str] | None = None, errno: int = errno_codes.EIO):
        self.errno = errno
        self.arm(kinds, fail_at)

    def arm(self, kinds: Iterable[str] | None, fail_at: int | None) -> None:
        """Forget the steps seen so far and fail at the ``fail_at``-th step of ``kinds`` from now on."""
        self.kinds = None if kinds is None else tuple(kinds)
        self.fail_at = fail_at
        self.ops: list[tuple[str, str]] = []
        self.seen = 0  # matching steps seen
        self.failed: tuple[str, str] | None = None
        self.failed_index: int | None = None  # index of the failed step in ``ops``

    def hook(self, op: str, path: str) -> None:
        self.ops.append((op, path))
        if self.fail_at is None or self.failed is not None or (self.kinds is not None and op not in self.kinds):
            return
        self.seen += 1
        if self.seen == self.fail_at:
            self.failed, self.failed_index = (op, path), len(self.ops) - 1
            name = errno_codes.errorcode.get(self.errno, str(self.errno))
            raise OSError(self.errno, f"injected {name} at step {self.failed_index} in {op}", path)


class NoSymlinkFS(LocalFS):
    """A LocalFS on a file system without symlinks (as some network and Windows ones)."""

    def symlink(self, target: str, path: str) -> None:
        self.hook("symlink", path)
        raise OSError(errno_codes.EPERM, "symlinks are not supported on this file system", path)
