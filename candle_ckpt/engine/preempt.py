"""A run's stop request and the end of its preemption save (no Keras here, and no signal handler).

:class:`PreemptionWatcher` is a run's request: a signal that the run's
:class:`~candle_ckpt.engine.signals.SignalOwner` caught (it holds one from
``restart()`` on, and hands it over when the run begins), a peer's request, or
a wall-time deadline, due when the time left is below ``need_s`` (the caller's
measured step and save time) plus the margin. The training loop asks
:meth:`PreemptionWatcher.due` at each step boundary, through the controller
(:mod:`candle_ckpt.engine.preempt_control`).

Once the controller has saved (:class:`Saved`), the run ends it with
:func:`finish_preempted`: the write made durable (and drained), the record
``stats()["preempt"]``, one log line, and :class:`PreemptExit` with the status
:func:`exit_status` gives, unless ``ckpt_preempt_exit_code=return``.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from candle_ckpt.core.log import OpsLog, position
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.resume import checkpoint_dir
from candle_ckpt.storage.drain import DRAIN_INCOMPLETE_EXIT

#: ``ckpt_preempt_exit_code`` words: exit with 128 + the signal's number, or return from ``fit``.
EXIT_SIGNAL, EXIT_RETURN = "signal", "return"


class PreemptExit(SystemExit):
    """Raised once a preemption checkpoint is committed and ``ckpt_preempt_exit_code`` is set.

    A ``SystemExit`` with that status, told apart from any other (a SIGTERM
    turned into ``SystemExit`` by the signal owner, the user's ``sys.exit``).
    When it reaches the interpreter uncaught, the process ends right after
    its ``atexit`` handlers, without the teardown of its modules (see
    :func:`quick_exit`).
    """

    @property
    def code(self) -> Any:
        code = SystemExit.code.__get__(self)
        if isinstance(code, int) and _interpreter_reads():
            quick_exit(code)
        return code

    @code.setter
    def code(self, value: Any) -> None:
        SystemExit.code.__set__(self, value)


@dataclass(frozen=True)
class Trigger:
    """Why and when a job was asked to stop.

    Attributes:
        reason: The signal's name (``"SIGTERM"``), ``"deadline"``, or a word another source chose.
        signum: The signal number, or None.
        at: ``time.monotonic()`` when it was noticed (in the signal handler for a signal).
    """

    reason: str
    signum: int | None
    at: float


class PreemptionWatcher:
    """The stop request of one run: a signal the run's :class:`~candle_ckpt.engine.signals.SignalOwner`
    handed over (:meth:`notice`), a peer's (:meth:`trigger`), or ``deadline`` coming close (:meth:`due`).

    It installs nothing: the owner catches :attr:`signals` for the length of the run.

    Args:
        signals: Signal numbers that ask the run to stop (none: only the deadline is watched).
        deadline: Epoch seconds when the job will be stopped, or None.
        margin: Seconds kept in reserve before the deadline.
    """

    def __init__(self, signals: Iterable[int] = (), deadline: float | None = None, margin: float = 60.0) -> None:
        self.signals = tuple(signals)
        self.deadline = deadline
        self.margin = margin
        # The request received so far, or None: a plain attribute, so that a caller may ask it at every epoch end
        # without entering this module.
        self.pending: Trigger | None = None
        # Called (in the signal handler) with the first signal's trigger: must only set a flag or an event.
        self.on_signal: Callable[[Trigger], None] | None = None

    @property
    def active(self) -> bool:
        """True if anything is watched at all (a signal or a deadline)."""
        return bool(self.signals) or self.deadline is not None

    def arm(self) -> None:
        """A run begins: forget the last run's request."""
        self.pending = None

    def notice(self, trigger: Trigger) -> None:
        """A caught signal (the owner's handler calls it): the first one is kept and told to :attr:`on_signal`."""
        if self.pending is None:
            self.pending = trigger
            if self.on_signal is not None:
                self.on_signal(trigger)

    def trigger(self, reason: str, signum: int | None = None) -> Trigger:
        """Record a stop request from another source (a peer worker, a test); the first one is kept."""
        if self.pending is None:
            self.pending = Trigger(reason, signum, time.monotonic())
        return self.pending

    def time_left(self) -> float | None:
        """Seconds until the deadline (negative once past), or None without one."""
        return None if self.deadline is None else self.deadline - time.time()

    def due(self, need_s: float = 0.0) -> Trigger | None:
        """The pending request, or a ``deadline`` one when less than ``need_s`` + margin is left.

        Args:
            need_s: What the caller needs before the deadline besides the
                margin: its measured time of one more step and one save.
        """
        if self.pending is None:
            left = self.time_left()
            if left is not None and left < need_s + self.margin:
                self.trigger("deadline")
        return self.pending


def preempt_record(trigger: Trigger, epoch: int, step: int | None, path: str | None, exit_code: int | None) -> dict:
    """The ``stats()["preempt"]`` record of a preemption save (callers may add their own keys)."""
    return {
        "reason": trigger.reason,
        "signal": trigger.signum,
        "epoch": epoch,
        "step": step,
        "checkpoint": path,
        "signal_to_commit_s": round(time.monotonic() - trigger.at, 6),
        "exit_code": exit_code,
    }


def preempt_message(trigger: Trigger, what: str, epoch: int, step: int | None, exit_code: int | None) -> str:
    """The one log line of a preemption save: what was saved, where in training, how long after, and what next."""
    # Keras's numbering: a step save is in epoch epoch + 1 (fit prints "Epoch {epoch + 1}/N"), an epoch save ends epoch.
    where = position(epoch, step)
    then = "training stops" if exit_code is None else f"exiting with status {exit_code}"
    return f"{trigger.reason}: {what} ({where}) {time.monotonic() - trigger.at:.3f} s after the request; {then}"


def exit_status(setting: int | str, trigger: Trigger) -> int | None:
    """The process's exit status after a preemption save, or None to return from ``fit``.

    ``"signal"``: 128 + the signal's number, what its default action gives
    (143 for SIGTERM; a deadline or a peer's request: 143). An int: itself.
    """
    if setting == EXIT_RETURN:
        return None
    if setting == EXIT_SIGNAL:
        return 128 + (trigger.signum if trigger.signum is not None else int(signal.SIGTERM))
    return int(setting)


@dataclass(frozen=True)
class Saved:
    """What the controller tells the run once it saved the preemption checkpoint.

    Attributes:
        trigger: The request it answered.
        epoch: Completed epochs.
        step: Steps done in the next epoch (a step checkpoint), or None (the epoch's checkpoint).
        sidecar: What the save returned (the step checkpoint's sidecar), or None.
        began: ``time.monotonic()`` when the save began.
        asked: ``(rank, reason)`` of the process that asked, when another one did; else None.
        agreement: The agreement's ``stats()``.
    """

    trigger: Trigger
    epoch: int
    step: int | None
    sidecar: Any
    began: float
    asked: tuple[int, str] | None
    agreement: dict[str, Any]


def finish_preempted(
    saved: Saved, engine: Any, setting: int | str, log: OpsLog, who: str = "", drain_s: float | None = None
) -> None:
    """The run's end of a preemption save: durable, recorded, said; then exit (:class:`PreemptExit`) or return.

    Args:
        saved: What the controller saved.
        engine: The run's ``CheckpointEngine``: ``finish()`` makes the write durable (or raises its error per
            ``ckpt_on_error``) and drains it within ``drain_s``; ``preempt`` keeps the record.
        setting: ``ckpt_preempt_exit_code``.
        log: The job's log.
        who: How this process is named in the line (``"process 1 "``), or "".
        drain_s: Seconds the drain to the persistent tier may take (with one), or None.

    Raises:
        PreemptExit: unless ``setting`` is ``"return"``.
    """
    if getattr(engine, "remote", None) is not None:
        engine.finish(drain_s=drain_s)
    else:
        engine.finish()
    side = saved.sidecar if isinstance(saved.sidecar, Sidecar) else None
    if side is None and saved.step is None:
        side = _epoch_sidecar(engine, saved.epoch)
    path = checkpoint_dir(engine.store.layout, side) if side is not None else None
    trigger, asked = saved.trigger, saved.asked
    code = exit_status(setting, trigger)
    drained = getattr(engine, "drained", None)
    if drained is False and code is not None:
        code = DRAIN_INCOMPLETE_EXIT  # the save is on this node's fast tier only: say so to the scheduler
    record = preempt_record(trigger, saved.epoch, saved.step, path, code)
    record["drained"] = drained
    record.update(save_s=round(time.monotonic() - saved.began, 6), agreement=saved.agreement)
    if asked:
        record["requested_by"] = asked[0]  # the rank that was asked
    engine.preempt = record
    what = f"committed {path}" if path else "saved its scratch copy" if engine.scratch_dir else ""
    what = (what or "no checkpoint could be committed") + (f" at process {asked[0]}'s request" if asked else "")
    if drained is not None:
        what += " and drained it to the persistent tier" if drained else ", NOT drained to the persistent tier"
    log.warning(preempt_message(trigger, who + what, saved.epoch, saved.step, code))
    if code is not None:
        raise PreemptExit(code)


def _epoch_sidecar(engine: Any, epoch: int) -> Sidecar | None:
    """The committed checkpoint of ``epoch`` that serves the request, if this process committed one."""
    records = engine.records
    if engine.scratch_dir is None and records and records[-1]["epoch"] == epoch and "step" not in records[-1]:
        return engine.store.read_sidecar(epoch)
    return None


_armed: list[int] = []  # the status :func:`quick_exit` ends the process with, once armed


def quick_exit(code: int) -> None:
    """End the process with ``code`` at the first garbage collection of the interpreter's finalization.

    Called when a :class:`PreemptExit` reaches the interpreter uncaught: Python reads its ``code`` to choose the
    process's status with no Python frame left below that read. That collection comes after non-daemon threads
    were joined, every ``atexit`` handler ran (``logging``'s flush, JAX's distributed shutdown, the user's own) and
    ``sys.stdout`` and ``sys.stderr`` were flushed; there every file object still open for writing is closed, as
    the teardown would have closed it, and the process ends with ``os._exit(code)``. What is skipped is the rest
    of the teardown: other ``__del__`` methods and weakref callbacks of objects still alive then. A process with
    TensorFlow and JAX loaded spends about 0.6 s in that teardown on a 2-core machine (the goodput benchmark's job,
    SIGTERM to the parent's ``wait()``: 0.9 to 1.0 s before, 0.3 to 0.4 s after), lost at every interruption, as
    the requeue waits for the process to end.

    A script that catches ``PreemptExit`` (its own code reads the status, or none does) ends as it chooses, with
    the whole teardown; so does one inside a wrapper that catches ``SystemExit`` (IPython, a launcher), and one
    with the collector disabled (no collection at finalization: nothing to arm it).
    """
    if _armed:
        return
    _armed.append(int(code))
    gc.callbacks.append(_at_collection)


def _interpreter_reads() -> bool:
    """Whether the caller of the function calling this was the interpreter itself: no Python frame below it.

    Only the stack's depth is read (a summary of at most three entries, no frame object kept)."""
    return len(traceback.extract_stack(limit=3)) <= 2


def _at_collection(phase: str, info: dict) -> None:
    if phase != "start" or not _armed or not sys.is_finalizing():
        return
    _close_open_files()
    os._exit(_armed[0])


def _close_open_files() -> None:
    """What the teardown would have done to every file object still open for writing when freeing it: close it
    (a ``gzip`` file writes its trailer then), or flush it if it is one of the standard streams."""
    std = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    for obj in gc.get_objects():
        if isinstance(obj, _FILE_BASE):
            try:
                if not obj.closed and obj.writable():
                    obj.flush() if id(obj) in std else obj.close()
            except Exception:  # a file already failing: the teardown would not have saved it either
                continue


#: The C base of every ``io`` class (``_io._IOBase``): an isinstance against it skips the ABC's hook, about 6
#: times faster over the half-million objects of a process with Keras, JAX and TensorFlow (0.03 s against 0.17 s).
_FILE_BASE: type = io.IOBase.__mro__[1] if io.IOBase.__mro__[1] is not object else io.IOBase
