"""Run commit jobs: inline (sync) or on one background thread (async).

The async writer follows TensorFlow's AsyncCheckpointHelper, tightened:

* the caller first waits for the job in flight (:meth:`AsyncWriter.wait`, the
  wait is recorded), *then* takes the host snapshot on its own thread, then
  submits. So the next optimizer step cannot change what is written, and at
  most one snapshot is alive at a time: peak extra host memory is one copy of
  the state, never two;
* an error in the writer is kept and re-raised on the caller's thread at the
  next ``check`` (the next save) or at ``close``, never swallowed; an error
  still pending at interpreter exit is reported through ``on_exit_error``;
* ``join`` takes a timeout; an ``atexit`` hook joins too, bounded by the same
  timeout, and logs when the wait runs out. During an asynchronous run a
  SIGTERM that is no preemption signal becomes a ``SystemExit`` (the signal
  owner, :mod:`candle_ckpt.engine.signals`), so the exit hook commits the last
  snapshot after SIGTERM as it does after Ctrl-C or a normal exit.

Whether a job may run in the background at all is a matter of memory: its host copy must fit beside training.
:func:`copy_refused` says when it would not: the least of the node's ``MemAvailable`` and the room left under
every memory limit of this process's cgroup and its ancestors (cgroup v2 and v1), since Slurm and PBS confine a
job to a cgroup whose limit may be far below the node's memory. Such a save is written inline (the engine).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable

from candle_ckpt.core.log import human_bytes

Job = Callable[[], None]
Log = Callable[[str, int], None]


class SaveFailure(Exception):
    """Carries the epoch of a failed commit from the writer to the caller (the engine wraps each commit in it)."""

    def __init__(self, epoch: int, err: BaseException) -> None:
        super().__init__(str(err))
        self.epoch = epoch
        self.err = err


class SyncWriter:
    """Runs each job on the caller's thread."""

    is_async = False

    def __init__(self) -> None:
        self.wait_s: list[float] = []

    def wait(self, timeout: float | None = None) -> None:
        """Nothing is ever in flight in sync mode."""

    def submit(self, job: Job, label: str = "a checkpoint write") -> None:
        job()

    def check(self) -> None:
        """Nothing is pending in sync mode."""

    def in_flight(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> bool:
        return True

    def close(self, timeout: float | None = None) -> bool:
        return True


class AsyncWriter:
    """Runs each job on a background thread, one at a time.

    Args:
        timeout: Seconds that ``wait``, ``join`` and the exit hook wait by default.
        log: ``log(message, level)`` for the writer's own events (a wait that
            runs out, the join at exit); :meth:`OpsLog.write` fits.
        on_exit_error: Called at interpreter exit with the error of the last
            job, which nobody can re-raise any more.
    """

    is_async = True

    def __init__(
        self,
        timeout: float = 600.0,
        log: Log | None = None,
        on_exit_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.log = log
        self.on_exit_error = on_exit_error
        self.wait_s: list[float] = []
        self._thread: threading.Thread | None = None
        # Set when the job in flight has finished. We wait on this rather than
        # on Thread.join / is_alive: on CPython 3.11 a join interrupted by a
        # signal handler's exception (our SIGTERM -> SystemExit, Ctrl-C) can
        # leave the thread marked stopped while it still runs, and the exit
        # hook would then skip the join.
        self._done = threading.Event()
        self._done.set()
        self._label = ""
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.exit_signal: int | None = None  # set by the run's SIGTERM handler: the signal that ended the process
        # Each writer registers its own exit hook, holding it only weakly.
        self._exit_hook = functools.partial(_join_at_exit, weakref.ref(self))
        atexit.register(self._exit_hook)

    def _run(self, job: Job, done: threading.Event) -> None:
        try:
            job()
        except BaseException as err:  # kept and re-raised on the caller's thread
            with self._lock:
                self._error = err
        finally:
            done.set()

    def _log(self, message: str, level: int) -> None:
        if self.log is not None:
            self.log(message, level)

    def check(self) -> None:
        """Re-raise the error of a finished job, once. Never blocks."""
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def in_flight(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the job in flight and record how long that took.

        Raises:
            TimeoutError: the job is still running after ``timeout`` seconds
                (default: the writer's timeout); it goes on in the background.
        """
        limit = self.timeout if timeout is None else timeout
        start = time.perf_counter()
        finished = self._done.wait(limit)
        self.wait_s.append(time.perf_counter() - start)
        if not finished:
            raise TimeoutError(f"{self._label} is still running after {limit:g} s (ckpt_async_timeout)")

    def submit(self, job: Job, label: str = "a checkpoint write") -> None:
        """Start ``job``; first wait for the one in flight (recorded) and re-raise its error."""
        if self.in_flight():
            self.wait()
        self.check()
        self._label = label
        done = self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(job, done), name="candle_ckpt-writer", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job in flight; True if none is left running."""
        limit = self.timeout if timeout is None else timeout
        if not self._done.wait(limit):
            self._log(f"{self._label} is still running after {limit:g} s (ckpt_async_timeout)", logging.WARNING)
            return False
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Join the last job and re-raise its error, if any; the exit hook is no longer needed."""
        done = self.join(timeout)
        if done:
            atexit.unregister(self._exit_hook)
        self.check()
        return done

    def join_at_exit(self) -> None:
        """The exit hook: commit the last snapshot (bounded), never swallow its error."""
        if self.in_flight():
            why = f" after {signal.Signals(self.exit_signal).name}" if self.exit_signal is not None else ""
            self._log(f"exit{why}: waiting up to {self.timeout:g} s for {self._label}", logging.INFO)
            if not self.join(self.timeout):
                self._log(
                    f"exit{why}: gave up on {self._label} after {self.timeout:g} s (ckpt_async_timeout); "
                    "it is not committed, and restart will use the previous checkpoint",
                    logging.ERROR,
                )
                return
            self._log(f"exit{why}: {self._label} is committed", logging.INFO)
        try:
            self.check()
        except BaseException as err:
            if self.on_exit_error is None:
                raise
            self.on_exit_error(err)


def _join_at_exit(ref: weakref.ref[AsyncWriter]) -> None:
    writer = ref()
    if writer is None:
        return
    try:
        writer.join_at_exit()
    except Exception:  # never let one writer's exit hook stop the other exit hooks
        logging.getLogger("candle_ckpt.engine.writer").exception("checkpoint writer failed at exit")


def slow_writer_message(
    epoch: int, written_epoch: int, nbytes: int, submitted: float, wait_start: float, wait_end: float
) -> str:
    """What to log when an epoch end finds the async writer still busy.

    Args:
        epoch: The epoch that had to wait.
        written_epoch: The epoch whose write was still running.
        nbytes: The size of that write's state.
        submitted: When that write was handed to the writer (``perf_counter``).
        wait_start: When this epoch end started waiting for it.
        wait_end: When the write was done.

    Returns:
        The waited time, the speed the write reached, the speed needed to keep
        up with this save interval, and what to do about it.
    """
    window = max(wait_start - submitted, 1e-9)  # the time the writer had before it was waited for
    took = max(wait_end - submitted, 1e-9)
    waited = wait_end - wait_start
    return (
        f"epoch {epoch}: training waited {waited:.2f} s for the checkpoint write of epoch {written_epoch}, "
        f"which was still running: it wrote {_amount(nbytes)}B in {took:.2f} s ({_amount(nbytes / took)}B/s), "
        f"and keeping up with one save every {window:.2f} s of training needs {_amount(nbytes / window)}B/s. "
        "Save less often (ckpt_save_interval), save less (ckpt_save_weights_only) or use faster storage "
        "(said once per run)"
    )


def inline_write_message(epoch: int, why: str) -> str:
    """What to log, once, when an asynchronous save could not copy the state and is written synchronously."""
    return (
        f"epoch {epoch}: {why}: this save, and each later one whose copy does not fit, is written before "
        "training goes on, as with ckpt_async=false (said once per run)"
    )


def _amount(n: float) -> str:
    """``n`` with a decimal prefix and three significant digits: "805 M", "1.23 G", "512 k"."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {prefix}"
    return f"{n:.3g} "


def make_writer(
    async_save: bool,
    timeout: float,
    log: Log | None = None,
    on_exit_error: Callable[[BaseException], None] | None = None,
) -> SyncWriter | AsyncWriter:
    return AsyncWriter(timeout, log, on_exit_error) if async_save else SyncWriter()


# A copy may take at most this share of the memory available: training, the writer and the file system's cache
# need the rest.
COPY_SHARE = 0.5


def available_memory(root: str = "/") -> int | None:
    """Bytes of host memory this process may still take, or None where nothing tells (not Linux).

    Args:
        root: Where ``/proc`` and ``/sys`` are found (tests give a directory laid out like them).
    """
    found = [n for n in (_meminfo(root), *_cgroup_room(root)) if n is not None]
    return max(0, min(found)) if found else None


def copy_refused(nbytes: int, root: str = "/") -> str | None:
    """Why a host copy of ``nbytes`` should not be taken (it would leave too little memory), or None if it fits."""
    room = available_memory(root)
    if room is None or nbytes <= COPY_SHARE * room:
        return None
    return (
        f"the host copy of an asynchronous save ({human_bytes(nbytes)}) would take more than half of the memory this "
        f"process may still use ({human_bytes(room)}, within its cgroup's limit)"
    )


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _meminfo(root: str) -> int | None:
    """The kernel's estimate of the memory available on the node (``MemAvailable``), in bytes."""
    text = _read(os.path.join(root, "proc/meminfo")) or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _number(text: str | None) -> int | None:
    """A cgroup file's number; None for ``max``, a missing file or anything else."""
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


def _cgroup_room(root: str) -> list[int]:
    """Limit minus usage for each memory-limited cgroup from this process's up to the root (v2 and v1)."""
    text = _read(os.path.join(root, "proc/self/cgroup")) or ""
    rooms: list[int] = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one unified hierarchy
            base, limit_file, usage_file = "sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_file, usage_file = "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            where = os.path.join(root, base, *parts[:depth])
            limit = _number(_read(os.path.join(where, limit_file)))
            usage = _number(_read(os.path.join(where, usage_file)))
            # v1 says "no limit" as a huge number (a page-rounded 2**63 - 1): not a limit.
            if limit is not None and usage is not None and limit < 1 << 62:
                rooms.append(limit - usage)
    return rooms
