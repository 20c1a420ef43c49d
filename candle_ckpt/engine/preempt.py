"""Notice that a job must stop soon: a scheduler's signal, or a wall-time deadline (no Keras here).

:class:`PreemptionWatcher` is armed for the length of one ``fit`` (or one
training loop). Its signal handler only records which signal came and when;
the training loop asks :meth:`PreemptionWatcher.due` at each step boundary
and, when it answers, commits a checkpoint and stops. A deadline is due
when the time left is below ``need_s`` (the caller's measured step and save
time) plus the margin.

For several workers (another module): every worker asks ``due`` locally,
the workers agree (a collective: any one due means all), and a worker that
learns from its peers calls :meth:`PreemptionWatcher.trigger` so that its own
record says why it stopped.

:func:`catch_early` (called by ``restart()``) catches the same signals from
then until a watcher arms: the first one is held and handed to that watcher,
which saves at ``fit``'s first step. If no watcher arms within
:data:`EARLY_GRACE_S`, the signal takes its default action after all.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from candle_ckpt.core.log import position

logger = logging.getLogger("candle_ckpt.engine.preempt")


class PreemptExit(SystemExit):
    """Raised once a preemption checkpoint is committed and ``ckpt_preempt_exit_code`` is set.

    A ``SystemExit`` with that status, told apart from any other (a SIGTERM
    turned into ``SystemExit`` by ``SigtermExit``, the user's ``sys.exit``).
    """


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


EARLY_GRACE_S = 60.0
_DEFAULTS = (signal.SIG_DFL, None, signal.default_int_handler)


class _EarlyCatch:
    """Signals caught between ``restart()`` and the first :meth:`PreemptionWatcher.arm` (one per process)."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.trigger: Trigger | None = None
        self.expired = False
        self.timer: threading.Timer | None = None

    def install(self, signals: Iterable[int]) -> list[str]:
        """Catch each of ``signals`` whose handler is the default; the names caught (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return []
        for signum in signals:
            if signum not in self.previous and signal.getsignal(signum) in _DEFAULTS:
                self.previous[signum] = signal.signal(signum, self._handle)
        return [signal.Signals(s).name for s in self.previous]

    def _handle(self, signum: int, frame: object) -> None:
        if self.expired:  # no watcher took it in time: the default action, as without candle_ckpt
            self.uninstall()
            signal.raise_signal(self.trigger.signum if self.trigger else signum)
            return
        if self.trigger is None:
            self.trigger = Trigger(signal.Signals(signum).name, signum, time.monotonic())
            self.timer = threading.Timer(EARLY_GRACE_S, self._expire)
            self.timer.daemon = True
            self.timer.start()

    def _expire(self) -> None:
        if self.trigger is not None and self.trigger.signum in self.previous:
            self.expired = True
            logger.warning(
                f"{self.trigger.reason} came before training started and no fit began within "
                f"{EARLY_GRACE_S:g} s: the signal takes its default action now"
            )
            os.kill(os.getpid(), self.trigger.signum)  # its handler runs on the main thread

    def take(self, signum: int) -> Any:
        """The handler from before :meth:`install` if ``signum`` is caught here (a watcher takes it over), else None."""
        if signum not in self.previous or signal.getsignal(signum) != self._handle:
            return None
        return self.previous.pop(signum)

    def adopt(self, signals: Iterable[int]) -> Trigger | None:
        """The held signal if it is one of ``signals`` (then forgotten here), else None."""
        held = self.trigger
        if held is None or held.signum not in tuple(signals):
            return None
        if self.timer is not None:
            self.timer.cancel()
        self.trigger, self.timer = None, None
        return held

    def uninstall(self) -> None:
        """Put the previous handlers back (main thread)."""
        for signum in list(self.previous):
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, self.previous[signum])
            del self.previous[signum]

    def finish(self, deliver: bool = True) -> None:
        """End the early catch (main thread): the previous handlers come back, and a signal still held
        (no watcher took it) is delivered to them when ``deliver``, as if it came now."""
        held, self.trigger, self.expired = self.trigger, None, False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.uninstall()
        if held is not None and held.signum is not None and deliver:
            signal.raise_signal(held.signum)


_EARLY = _EarlyCatch()


def end_early_catch(deliver: bool = True) -> None:
    """End what :func:`catch_early` started (on the main thread; elsewhere nothing happens).

    Every watcher's :meth:`PreemptionWatcher.arm` calls it once it has taken
    over its own signals, so the catch never outlives the first fit.
    """
    if threading.current_thread() is threading.main_thread():
        _EARLY.finish(deliver)


def catch_early(signals: Iterable[int]) -> list[str]:
    """Catch ``signals`` from now until a :class:`PreemptionWatcher` arms (see the module docstring).

    Returns the names of the signals caught (none off the main thread, none
    whose handler the program installed itself).
    """
    return _EARLY.install(signals)


class PreemptionWatcher:
    """Catch ``signals`` and watch ``deadline`` between :meth:`arm` and :meth:`disarm`.

    Args:
        signals: Signal numbers to catch (none: only the deadline is watched).
        deadline: Epoch seconds when the job will be stopped, or None.
        margin: Seconds kept in reserve before the deadline.
    """

    def __init__(self, signals: Iterable[int] = (), deadline: float | None = None, margin: float = 60.0) -> None:
        self.signals = tuple(signals)
        self.deadline = deadline
        self.margin = margin
        self._trigger: Trigger | None = None
        self._previous: dict[int, Any] = {}
        self._released = False
        self._restoring = False
        self.left_alone: list[str] = []  # signals whose handler the program installed itself (not caught)
        # Called (in the signal handler) with the first signal's trigger: must only set a flag or an event.
        self.on_signal: Callable[[Trigger], None] | None = None

    @property
    def active(self) -> bool:
        """True if anything is watched at all (a signal or a deadline)."""
        return bool(self.signals) or self.deadline is not None

    def arm(self) -> list[str]:
        """Forget an earlier trigger and install the handlers; return the names of the signals caught.

        A signal :func:`catch_early` holds (it came after ``restart()``) becomes
        this watcher's pending request.

        Handlers can be installed on the main thread only; elsewhere nothing
        is caught (the deadline is still watched) and a warning says so. A
        handler the program installed itself is kept (as ``SigtermExit``
        keeps it): that signal is not caught, and :attr:`left_alone` names it.
        """
        self._trigger = None
        self._released = False
        self.left_alone: list[str] = []
        if not self.signals:
            end_early_catch()
            return []
        if threading.current_thread() is not threading.main_thread():
            logger.warning("preemption signals are caught on the main thread only; this fit runs on another")
            return []
        for signum in self.signals:
            if signum in self._previous:
                continue
            early = _EARLY.take(signum)  # caught since restart(): the handler before that comes back at disarm
            current = signal.getsignal(signum)
            if early is not None or current in (signal.SIG_DFL, signal.SIG_IGN, None, signal.default_int_handler):
                previous = signal.signal(signum, self._handle)
                self._previous[signum] = early if early is not None else previous
            else:
                self.left_alone.append(signal.Signals(signum).name)
        self._trigger = _EARLY.adopt(self._previous)
        end_early_catch()  # signals this watcher does not catch get their handlers back
        return [signal.Signals(s).name for s in self._previous]

    def catches(self, name: str) -> bool:
        """Whether this watcher's handler is installed for the signal named ``name`` (``"SIGTERM"``) now."""
        return any(signal.Signals(signum).name == name for signum in self._previous)

    def disarm(self) -> None:
        """Put back the handlers that were installed before :meth:`arm` (where ours are still in place)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._previous[signum]

    def release(self) -> None:
        """From any thread, when training ended without :meth:`disarm` (``fit`` raised): the main thread
        is interrupted to put the previous handlers back (``_thread.interrupt_main`` runs our handler there)."""
        self._released = True
        if self._previous:
            self._restoring = True
            _thread.interrupt_main(next(iter(self._previous)))

    def _handle(self, signum: int, frame: object) -> None:
        if self._restoring:  # the interrupt release() asked for (a real signal in that instant merges into it)
            self._restoring = False
            if self._released:
                self.disarm()
            return
        if self._released:  # a real signal after the fit ended: the previous handler takes it
            self.disarm()
            signal.raise_signal(signum)
            return
        # Only a record: the save happens at the next step boundary, on the training thread.
        if self._trigger is None:
            self._trigger = Trigger(signal.Signals(signum).name, signum, time.monotonic())
            if self.on_signal is not None:
                self.on_signal(self._trigger)

    def trigger(self, reason: str, signum: int | None = None) -> Trigger:
        """Record a stop request from another source (a peer worker, a test); the first one is kept."""
        if self._trigger is None:
            self._trigger = Trigger(reason, signum, time.monotonic())
        return self._trigger

    @property
    def pending(self) -> Trigger | None:
        """The request received so far, or None."""
        return self._trigger

    def time_left(self) -> float | None:
        """Seconds until the deadline (negative once past), or None without one."""
        return None if self.deadline is None else self.deadline - time.time()

    def due(self, need_s: float = 0.0) -> Trigger | None:
        """The pending request, or a ``deadline`` one when less than ``need_s`` + margin is left.

        Args:
            need_s: What the caller needs before the deadline besides the
                margin: its measured time of one more step and one save.
        """
        if self._trigger is None:
            left = self.time_left()
            if left is not None and left < need_s + self.margin:
                self.trigger("deadline")
        return self._trigger


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
