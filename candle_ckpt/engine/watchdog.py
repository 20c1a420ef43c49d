"""The hang watchdog: a run that makes no progress for too long is ended, so that the scheduler requeues it.

*Progress* is a step that ended (a training or a validation batch), a save that finished, or a meeting of the
processes that finished. :class:`Watchdog` is made by :class:`~candle_ckpt.engine.run.TrainingRun` and armed
with the run's signal handlers (:meth:`~candle_ckpt.engine.signals.SignalOwner.watch`), stopped when the run lets
go (:meth:`~candle_ckpt.engine.signals.SignalOwner.release`, after its last meetings). Its daemon thread wakes
every few seconds (a bounded wait on a monotonic clock) and compares the time since the last progress with the
limit of the *phase* the run is in:

- ``restore``: inside ``restart()``'s restore (the history, choose, verify, read: :mod:`candle_ckpt.engine.restore`
  watches it with a watchdog of its own, stopped when ``restart()`` returns, so the user's set-up between
  ``restart()`` and ``fit`` is never watched);
- ``open``: inside the opening of the checkpoint directory, when a front end is made and when each ``fit``
  begins (its writer lock and checks: :meth:`~candle_ckpt.engine.engine.CheckpointEngine.open`, watched by
  :func:`watched` for its length only);
- ``start``: before the first step ended (start-up, the first batch, the compile);
- ``input``: the training thread waits for its next batch (the input pipeline);
- ``step``: inside a step, a validation pass or a callback between steps;
- ``save``: inside a checkpoint save or the wait for one;
- ``meeting``: inside a meeting of the processes of a multi-process job.

The training thread's cost per step is one timestamp stored. ``input`` and ``step`` are told apart only once a
hang is seen, from where the training thread stands (the front end's ``where`` probe: its framework's data
pipeline or not).

``ckpt_hang_timeout`` sets the limit: seconds (in every phase, the restore included), none (no watchdog), or
``auto`` (:func:`auto_limit`): in the restore, the opening and before the first step ends :data:`START_S`;
after it, the largest of :data:`FLOOR_S`, twice the first step (start-up and compile: a later compile, the
validation's, takes no longer) and :data:`SAFETY` times the longest interval seen so far for the phase's kind
(steps, saves or meetings; a kind not seen yet takes the longest interval of any kind). With steps under 12 s
and a first step under a minute, a hang is ended within 2 minutes.

On a hang (:meth:`Watchdog.fire`): one block in ``ckpt.log`` naming the phase, the time without progress and
the limit, followed by every thread's stack (:func:`faulthandler.dump_traceback`); the same on stderr; a
``failure`` record (``error="hang"``, ``phase``) in the restart history; then the process exits with
:data:`HANG_EXIT` (124, the status of ``timeout(1)``), which the documented Slurm script requeues. Nothing is
saved: the committed checkpoints stay as they are, and the rerun resumes from the newest. Those writes run on a
thread of their own, waited for at most :data:`REPORT_S`: a file system that stopped answering cannot keep
the process from exiting.

In a multi-process JAX job each process runs its own watchdog: the stuck one, and the ones waiting for it in
a step's collective or a meeting. A peer that *died* is the JAX coordination service's to notice (its
heartbeat, ``heartbeat_timeout_seconds``, 100 s by default): it ends the others with its own fatal error, and
the watchdog does not stand in its way. A hang one process finds is said to the others, and process 0 exits
last (:mod:`~candle_ckpt.engine.hang_notice`), so that the job's status is 124 under ``srun`` too.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from candle_ckpt.engine.hang_notice import HANDOFF_S, LISTEN, HangNotice

#: The exit status of a process the watchdog ended (as ``timeout(1)``'s): the Slurm script requeues it.
HANG_EXIT = 124
START_S = 600.0  # auto: the limit in restart()'s restore, the opening, and before the first step ended (compile)
FLOOR_S = 60.0  # auto: never less, once a step ended
SAFETY = 5.0  # auto: times the longest interval seen (NVIDIA's resiliency extension uses 5)
REPORT_S = 10.0  # the most the hang's report (log, stderr, history) may take before the process exits
PHASES = ("restore", "open", "start", "input", "step", "save", "meeting")
_OURS = ("restore", "open")  # work of ours outside a run, each watched alone (START_S under auto)
_KIND = {"input": "step", "step": "step", "save": "save", "meeting": "meeting"}
_SAID = {
    "restore": "restart() choosing, verifying or reading the checkpoint to resume from",
    "open": "opening the checkpoint directory: its writer lock and checks",
    "start": "before the first step ended",
    "input": "waiting for the next batch of the input pipeline",
    "step": "inside a training step",
    "save": "inside a checkpoint save",
    "meeting": "waiting for the other processes at a meeting",
}


def auto_limit(phase: str, first_s: float | None, longest: Mapping[str, float]) -> float:
    """``ckpt_hang_timeout=auto``'s limit in ``phase`` (see the module docstring).

    Args:
        phase: One of :data:`PHASES`.
        first_s: Seconds from the run's start to its first step's end; None before it.
        longest: The longest interval seen so far per kind (``"step"``, ``"save"``, ``"meeting"``).
    """
    if first_s is None or phase in _OURS:
        return START_S
    seen = longest.get(_KIND.get(phase, "step"))
    if seen is None:
        seen = max([first_s, *longest.values()])
    return max(FLOOR_S, 2.0 * first_s, SAFETY * seen)


class Watchdog:
    """Ends a run that makes no progress for longer than its limit (see the module docstring).

    Args:
        timeout: ``ckpt_hang_timeout``: ``"auto"``, seconds, or None (off: nothing is watched).
        log_path: ``ckpt.log``'s path (the hang's block is appended there), or None.
        record_failure: Records the hang in the restart history (``record_failure(error, phase)``: the run's
            :func:`~candle_ckpt.engine.restart_history.record_failure`), or None.
        who: How this process is named in the block (``"process 1 of 2"``), or "".
        where: The front end's probe, called once on a hang in ``step``: ``"input"`` when the training
            thread waits in its framework's data pipeline, else None.
        saves: The longest save the engine measured so far, in seconds (an asynchronous one's write, which the
            training thread waits for only at the next save or the end), for auto's ``save`` kind.
        exit: What ends the process (``os._exit``; a test passes its own).
        moving: A probe read at each wake-up (:class:`ReadMeter`: the bytes this process read and wrote so far);
            a new value is progress. The restore's: a long read that moves is not a hang, one that stopped is.
    """

    def __init__(
        self,
        timeout: float | str | None,
        log_path: str | None = None,
        record_failure: Callable[[str, str], None] | None = None,
        *,
        who: str = "",
        where: Callable[[], str | None] | None = None,
        saves: Callable[[], float] | None = None,
        exit: Callable[[int], Any] = os._exit,
        moving: Callable[[], int | None] | None = None,
    ) -> None:
        self.timeout, self.log_path, self.record_failure = timeout, log_path, record_failure
        self.who, self.where, self.saves, self._exit, self.moving = who, where, saves, exit, moving
        self.on = timeout is not None
        self.last = 0.0  # monotonic time of the last progress: the one store per step (beat)
        self.phase = "step"  # where the training thread is: step (or input), save or meeting; see now()
        self.first_s: float | None = None
        self.longest: dict[str, float] = {}
        self._began = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.notice: HangNotice | None = None

    def among(self, group: Any) -> None:
        """The processes of this run or restore: a hang is said to them and heard from them (:mod:`.hang_notice`)."""
        self.notice = HangNotice(group) if group.size > 1 else None

    # -- the training thread's side ------------------------------------------------------------------------
    def beat(self) -> None:
        """A step ended (the training thread's only per-step cost)."""
        self.last = time.monotonic()

    @contextlib.contextmanager
    def phase_of(self, phase: str) -> Iterator[None]:
        """Mark the training thread as in ``phase`` (``"save"``, ``"meeting"``) while inside; its end is progress."""
        if not self.on or threading.current_thread() is not threading.main_thread():
            yield
            return
        before, self.phase = self.phase, phase
        began = time.monotonic()
        try:
            yield
        finally:
            now = time.monotonic()
            kind = _KIND[phase]
            self.longest[kind] = max(self.longest.get(kind, 0.0), now - began)
            self.phase, self.last = before, now

    # -- the watchdog's side -------------------------------------------------------------------------------
    def now(self) -> str:
        """The phase the run is in now (``start`` until the first step ended)."""
        return "start" if self.first_s is None and self.phase == "step" else self.phase

    def limit(self) -> float:
        """The limit of the phase the run is in now."""
        if isinstance(self.timeout, int | float):
            return float(self.timeout)
        longest = dict(self.longest)
        if self.saves is not None:
            with contextlib.suppress(Exception):  # read from this thread: a list the training thread appends to
                longest["save"] = max(longest.get("save", 0.0), float(self.saves()))
        return auto_limit(self.phase, self.first_s, longest)

    def arm(self, phase: str = "step") -> None:
        """The run begins (``phase`` ``"step"``; :mod:`~candle_ckpt.engine.restore` arms its own in ``"restore"``):
        start watching (no thread when off)."""
        if not self.on or self._thread is not None:
            return
        self._began = self.last = time.monotonic()
        self.phase, self.first_s, self.longest = phase, None, {}
        self._stop = threading.Event()  # this run's: a thread of an earlier run still asleep ends at its wake-up
        self._thread = threading.Thread(
            target=self._watch, args=(self._stop,), name="candle_ckpt-watchdog", daemon=True
        )
        self._thread.start()

    def disarm(self) -> None:
        """The run ended: stop watching (the thread ends at its next wake-up)."""
        self._stop.set()
        self._thread = None

    def _watch(self, stop: threading.Event) -> None:
        seen, moved = self.last, self.moving() if self.moving is not None else None
        moved_at = seen
        while True:
            limit = self.limit()
            if stop.wait(min(5.0, max(0.2, limit / 10.0))):
                return
            if self.moving is not None and moved != (moved := self.moving()):
                moved_at = time.monotonic()  # the probe moved (bytes read or written): progress, for the limit
            last, now = self.last, time.monotonic()
            if last != seen:  # progress since the last wake-up: learn the interval (at most the time between)
                if self.first_s is None:
                    self.first_s = last - self._began
                elif self.phase in ("step", "input"):
                    self.longest["step"] = max(self.longest.get("step", 0.0), last - seen)
                seen = last
            idle = now - max(last, moved_at)
            # A peer's word is listened for once the run itself (a step, a save, a meeting) has not moved for a
            # quarter of the limit (or of a meeting's bound, if shorter: HangNotice.bound, an attribute, so that a
            # wake-up calls nothing in hang_notice until it listens), whatever bytes moved meanwhile: a process stuck
            # in a read still hears of the hang that a peer found waiting for it (a JAX process's own service moves a
            # few bytes now and then).
            notice = self.notice
            listens = notice is not None and now - last > LISTEN * min(self.limit(), notice.bound)
            peer = notice.heard() if listens else None
            if (peer is not None or idle > self.limit()) and not stop.is_set():
                self.fire(idle, self.limit(), peer=peer)
                return

    def fire(self, idle: float, limit: float, how: str | None = None, peer: str | None = None) -> None:
        """Tell the other processes, if this one found the hang (before the report: theirs overlap it), report it
        (bounded by :data:`REPORT_S`), let them leave first (:meth:`~candle_ckpt.engine.hang_notice.HangNotice.leave`),
        then end the process with :data:`HANG_EXIT`.

        ``how``: what set ``limit``, when not ``ckpt_hang_timeout`` (a group's meeting bound that ran out);
        ``peer``: the process that found the hang first, when this one heard it from it."""
        phase = self.now()
        if phase == "step" and self.where is not None:
            with contextlib.suppress(Exception):
                phase = self.where() or phase
        how = how or ("auto" if self.timeout == "auto" else "ckpt_hang_timeout")
        heard = f"; {peer} found the job hung first" if peer else ""
        line = (
            f"hang: {self.who + ' ' if self.who else ''}made no progress for {idle:.0f} s (limit {limit:.0f} s, "
            f"{how}) in phase {phase} ({_SAID.get(phase, phase)}){heard}; every thread's stack follows; the "
            f"committed checkpoints are left as they are; exiting with status {HANG_EXIT} to be requeued"
        )
        if self._exit is os._exit:  # the interpreter's own end (the training thread failed: a peer left) waits
            atexit.register(time.sleep, REPORT_S + HANDOFF_S + 5.0)  # for this one's, with status 124
        if self.notice is not None and peer is None:  # the others first: their reports overlap this one's
            threading.Thread(target=self.notice.tell, args=(self.who,), name="candle_ckpt-hang", daemon=True).start()
        reporter = threading.Thread(target=self._report, args=(line, phase), name="candle_ckpt-hang", daemon=True)
        reporter.start()
        reporter.join(REPORT_S)
        if self.notice is not None:  # process 0, the JAX service's host, leaves last (hang_notice.py)
            handoff = threading.Thread(target=self.notice.leave, name="candle_ckpt-hang", daemon=True)
            handoff.start()
            handoff.join(HANDOFF_S + REPORT_S)
        self._exit(HANG_EXIT)

    def _report(self, line: str, phase: str) -> None:
        """The hang's block to ckpt.log and stderr (one write each), then its record in the restart history."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        block = f"{stamp} ERROR {line}\n{stacks()}".encode("utf-8", "replace")
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), block)
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                _append(self.log_path, block)
        if self.record_failure is not None:
            with contextlib.suppress(Exception):
                self.record_failure("hang", phase)


class ReadMeter:
    """The bytes this process has read and written through files so far (Linux's ``/proc/self/io``, ``rchar`` +
    ``wchar``: local and network file systems, pipes, and the local copy that a download from an object store
    writes as it goes; not a socket's ``recv``), less the meter's own reads of that file; None where there is
    none. ``/proc/self/io`` shows ``rchar`` as it was before the read that returns it, so the meter's own bytes
    are subtracted from the next value: with nothing else read or written, two calls give the same number.
    """

    def __init__(self) -> None:
        self._own = 0

    def __call__(self) -> int | None:
        try:
            fd = os.open("/proc/self/io", os.O_RDONLY)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
            fields = dict(line.split(b":") for line in data.splitlines() if b":" in line)
            value = int(fields[b"rchar"]) + int(fields[b"wchar"]) - self._own
        except (OSError, KeyError, ValueError):
            return None
        self._own += len(data)
        return value


class WatchedGroup:
    """A run's :class:`~candle_ckpt.core.group.Group` whose meetings on the training thread are phase ``meeting``.

    Lanes (meetings on other threads: the preemption agreement's) are the group's own, unwatched.
    """

    def __init__(self, group: Any, watchdog: Watchdog) -> None:
        self.group, self.watchdog = group, watchdog
        self.rank, self.size = group.rank, group.size

    def __repr__(self) -> str:
        return f"WatchedGroup({self.group!r})"

    def __getattr__(self, name: str) -> Any:  # the group's own (a StoreGroup's store and prefix)
        return getattr(self.__dict__["group"], name)

    def barrier(self, name: str, timeout_s: float) -> None:
        with self.watchdog.phase_of("meeting"):
            self.group.barrier(name, timeout_s)

    def broadcast(self, name: str, value: str | None, timeout_s: float) -> str:
        with self.watchdog.phase_of("meeting"):
            return self.group.broadcast(name, value, timeout_s)

    def all_agree(self, name: str, ok: bool, timeout_s: float) -> bool:
        with self.watchdog.phase_of("meeting"):
            return self.group.all_agree(name, ok, timeout_s)

    def exchange(self, name: str, value: str, timeout_s: float) -> list[str]:
        with self.watchdog.phase_of("meeting"):
            return self.group.exchange(name, value, timeout_s)

    def collect(self, name: str, value: str, timeout_s: float) -> list[str] | None:
        with self.watchdog.phase_of("meeting"):
            return self.group.collect(name, value, timeout_s)

    def meeting(self, kind: str) -> str:
        return self.group.meeting(kind)

    def notice(self, name: str, value: str) -> bool:
        return self.group.notice(name, value)

    def heard(self, name: str, timeout_s: float) -> str | None:
        return self.group.heard(name, timeout_s)

    def lane(self, name: str) -> Any:
        return self.group.lane(name)

    def close(self, timeout_s: float) -> bool:
        with self.watchdog.phase_of("meeting"):
            return self.group.close(timeout_s)


@contextlib.contextmanager
def watched(
    timeout: float | str | None,
    log_path: str | None,
    phase: str,
    record_failure: Callable[[str, str], None] | None = None,
    *,
    who: str = "",
    exit: Callable[[int], Any] = os._exit,
    group: Any = None,
) -> Iterator[Watchdog]:
    """Work of ours outside a run, under a watchdog of its own for its length: armed in ``phase`` (one of
    :data:`_OURS`), where any byte this process reads or writes is progress (:class:`ReadMeter`), so that a slow
    disk is never taken for a hang and one that stopped answering is (the arguments: :class:`Watchdog`'s; ``group``:
    the processes that hear of the hang, :meth:`Watchdog.among`)."""
    watchdog = Watchdog(timeout, log_path, record_failure, who=who, exit=exit, moving=ReadMeter())
    if group is not None:
        watchdog.among(group)
    watchdog.arm(phase)
    try:
        yield watchdog
    finally:
        watchdog.disarm()


def stacks() -> str:
    """Every thread's stack now, as :func:`faulthandler.dump_traceback` writes it."""
    with tempfile.TemporaryFile() as tmp:
        faulthandler.dump_traceback(tmp, all_threads=True)
        tmp.seek(0)
        return tmp.read().decode("utf-8", "replace")


def _append(path: str, data: bytes) -> None:
    """Append ``data`` to ``path`` in one write (a block from another process never lands inside it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "FLOOR_S", "HANG_EXIT", "PHASES", "SAFETY", "START_S", "ReadMeter", "WatchedGroup", "Watchdog", "auto_limit",
    "watched",
]  # fmt: skip
