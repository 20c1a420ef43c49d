"""Run commit jobs: inline (sync) or on one background thread (async).

The async writer follows TensorFlow's AsyncCheckpointHelper, tightened:

* the caller takes the host snapshot on its own thread *before* submitting,
  so the next optimizer step cannot change what is written;
* at most one job is in flight: ``submit`` first waits for the previous one,
  and that wait is recorded, so memory never grows beyond one snapshot;
* an error in the writer is kept and re-raised on the caller's thread at the
  next ``submit`` or at ``join`` (``check``), never swallowed;
* ``join`` takes a timeout; an ``atexit`` hook joins too (bounded), so the last
  snapshot is committed after Ctrl-C or a normal exit.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable

Job = Callable[[], None]


class SyncWriter:
    """Runs each job on the caller's thread."""

    is_async = False

    def __init__(self) -> None:
        self.wait_s: list[float] = []

    def submit(self, job: Job) -> None:
        job()

    def check(self) -> None:
        """Nothing is pending in sync mode."""

    def join(self, timeout: float | None = None) -> bool:
        return True

    def close(self, timeout: float | None = None) -> bool:
        return True


class AsyncWriter:
    """Runs each job on a background thread, one at a time.

    Args:
        timeout: Default seconds ``join``/``close`` and the exit hook wait.
        on_timeout: Called with a message when a wait runs out.
    """

    is_async = True

    def __init__(self, timeout: float = 600.0, on_timeout: Callable[[str], None] | None = None) -> None:
        self.timeout = timeout
        self.on_timeout = on_timeout
        self.wait_s: list[float] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        _LIVE.add(self)

    def _run(self, job: Job) -> None:
        try:
            job()
        except BaseException as err:  # kept and re-raised on the caller's thread
            with self._lock:
                self._error = err

    def check(self) -> None:
        """Re-raise the error of a finished job, once."""
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: Job) -> None:
        """Wait for the job in flight (recording the wait), then start ``job``."""
        start = time.perf_counter()
        if not self.join(self.timeout):
            raise TimeoutError(f"the previous checkpoint write is still running after {self.timeout} s")
        self.wait_s.append(time.perf_counter() - start)
        self.check()
        self._thread = threading.Thread(target=self._run, args=(job,), name="candle_ckpt-writer", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job in flight; True if none is left running."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(self.timeout if timeout is None else timeout)
        if thread.is_alive():
            if self.on_timeout:
                self.on_timeout(
                    f"checkpoint writer still running after {timeout if timeout is not None else self.timeout} s"
                )
            return False
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Join the last job and re-raise its error, if any."""
        done = self.join(timeout)
        self.check()
        return done


_LIVE: weakref.WeakSet[AsyncWriter] = weakref.WeakSet()


@atexit.register
def _join_all_at_exit() -> None:
    for writer in list(_LIVE):
        try:
            writer.join()
        except Exception:  # never let one writer's exit hook stop the others
            pass


def make_writer(async_save: bool, timeout: float, on_timeout: Callable[[str], None] | None = None):
    return AsyncWriter(timeout, on_timeout) if async_save else SyncWriter()
