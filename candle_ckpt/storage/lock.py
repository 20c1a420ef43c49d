"""The writer lock of a checkpoint directory: one ``flock`` per holder object, never shared with a forked child."""

from __future__ import annotations

import fcntl
import os
import socket
import time
import weakref
from collections.abc import Callable

from candle_ckpt.core.errors import DirectoryLocked

# Called (on the calling thread) when a writer finds the lock held by this same process: a ``fit`` that raised
# may hold it still. The fit guard (:mod:`candle_ckpt.engine.fit_port`) adds its notice here when it is
# imported; storage knows no fit, and without a guard there is no fit to notice.
_HELD_HERE_HOOKS: list[Callable[[], None]] = []


# The locks this process holds. A child forked from it (a ``multiprocessing`` pool's worker reading a PyDataset)
# shares each lock's open file, and ``flock`` lasts while any process keeps that file open: a worker that outlives
# its killed parent kept the directory locked, and the requeued job was refused. The child is not the writer, so it
# drops its copies at once (below).
_HELD: weakref.WeakSet[WriterLock] = weakref.WeakSet()


def _forked() -> None:
    """In a forked child: close the lock files inherited from the parent, which alone holds the locks."""
    for lock in list(_HELD):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forked)


def on_held_by_this_process(hook: Callable[[], None]) -> None:
    """Have ``hook()`` called when a writer of this process finds the lock taken by this process (once per hook)."""
    if hook not in _HELD_HERE_HOOKS:
        _HELD_HERE_HOOKS.append(hook)


class WriterLock:
    """The writer lock of one checkpoint directory, owned by the object that took it.

    ``flock`` is tied to the open file: the kernel drops it when the holder
    dies, so a lock left by a killed process never blocks the next run. Each
    :class:`WriterLock` opens the file itself, so two holders in one process
    exclude each other exactly as two processes do.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_same_process_s: float = 5.0) -> bool:
        """Take the lock; return True if it was taken now (False: already held here).

        A holder in this same process gets ``wait_same_process_s`` seconds to
        let go: a ``fit`` that has raised releases its lock from a watchdog
        thread (:mod:`candle_ckpt.engine.fit_port`), a moment after its
        ``CallbackList`` dies, or after this thread, the one that ran that
        ``fit``, sees it is no longer on its stack (its exception is kept).

        Raises:
            DirectoryLocked: another holder (this process or another) keeps it.
        """
        if self._fd is not None:
            return False
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_same_process_s
        noticed = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown process"
                if holder.startswith(f"pid {os.getpid()} ") and time.monotonic() < deadline:
                    if not noticed:
                        for hook in list(_HELD_HERE_HOOKS):
                            hook()
                        noticed = True
                    time.sleep(0.02)
                    continue
                os.close(fd)
                raise DirectoryLocked(self._refusal(holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n".encode(), 0)
        self._fd = fd
        _HELD.add(self)
        return True

    def _refusal(self, holder: str) -> str:
        directory = os.path.dirname(os.path.dirname(self.path))
        if holder.startswith(f"pid {os.getpid()} "):
            how = (
                "another writer in this same process holds it (a callback inside fit, a JobRunner, or a "
                "CheckpointStore opened for writing and not closed: call its close())"
            )
        else:
            how = "stop the other job, or use another ckpt_directory (a killed job's lock is released by the kernel)"
        return (
            f"checkpoint directory {directory} is in use by another writer ({holder}); refusing a second "
            f"concurrent writer: {how}"
        )

    def __del__(self) -> None:  # a forgotten holder must not keep the directory locked
        self.release()

    def release(self) -> None:
        """Let go of the lock (no-op if not held)."""
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        if fd is not None:
            os.close(fd)
