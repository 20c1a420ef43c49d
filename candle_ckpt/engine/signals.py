"""The one owner of every signal handler candle_ckpt installs: held, watched, then all given back at once.

A process has one table of signal handlers, so it has one :class:`SignalOwner` (:func:`process_signals`);
nothing else in the package calls ``signal.signal`` (``tests/unit/test_architecture.py``). Like Lightning's
signal connector, it records every handler it replaced and puts them all back in one teardown. Its three
phases:

- **held**, from ``restart()`` (:meth:`SignalOwner.hold`): each preemption signal whose handler is the
  default is caught; the first one that comes is held for the run's first step. If no run begins within
  :data:`HOLD_GRACE_S`, it takes its default action after all.
- **watched**, from a run's ``begin`` (:meth:`SignalOwner.watch`, which returns the run's :class:`Lease`):
  each preemption signal is handed, as a :class:`~candle_ckpt.engine.preempt.Trigger`, to the run's
  listener (the controller's watcher, which only records it and wakes the notice thread); a held one is
  handed over at once, and held signals the run does not watch get their handlers back (and the held one its
  default action). SIGTERM, if it is no preemption signal and writes are asynchronous, becomes
  ``SystemExit(143)`` so that the writer's exit hook commits the write in flight. The run's hang watchdog
  (:mod:`candle_ckpt.engine.watchdog`) is armed last, with the handlers.
- **after**, from the run's end (:meth:`SignalOwner.end`, or :meth:`SignalOwner.release` from another thread
  when ``fit`` raised): every handler comes back, and the watchdog stops (after the run's last meetings). A
  signal that comes between a release and the main thread's teardown goes to the handler from before: a
  SIGTERM after ``fit`` ends the process as it would have without candle_ckpt.

A handler the program installed itself is never replaced: that signal is left alone (and named in the lease).
Handlers can be installed on the main thread only: elsewhere nothing is caught (the watchdog still runs).
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.config.preemption import signal_numbers
from candle_ckpt.engine.decision import checkpointing_off
from candle_ckpt.engine.preempt import Trigger

logger = logging.getLogger("candle_ckpt.engine.signals")

#: Seconds a signal held since ``restart()`` waits for a run before it takes its default action.
HOLD_GRACE_S = 60.0
HOLD, WATCH, EXIT = "hold", "watch", "exit"  # the role of each handler the owner installed
_UNSET = (signal.SIG_DFL, None, signal.default_int_handler)  # no handler of the program's: held
_TAKEN = (*_UNSET, signal.SIG_IGN)  # watched too (an ignored signal still asks a run to stop)


@dataclass
class Lease:
    """What one run asked of the owner (:meth:`SignalOwner.watch`), and what it got.

    Attributes:
        caught: The preemption signals whose handler is the owner's for this run (names).
        left_alone: The preemption signals with a handler the program installed itself (not caught).
        held: The signal held since ``restart()`` that was handed to the listener, or None.
        exits: SIGTERM becomes ``SystemExit`` for this run.
    """

    caught: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)
    held: Trigger | None = None
    exits: bool = False
    listener: Callable[[Trigger], None] | None = None
    on_exit: Callable[[int], None] | None = None
    watchdog: Any = None
    released: bool = False


def _main() -> bool:
    return threading.current_thread() is threading.main_thread()


def _name(signum: int) -> str:
    return signal.Signals(signum).name


class SignalOwner:
    """Every handler candle_ckpt installs, in three phases (see the module docstring)."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}  # each signal's handler from before ours
        self._role: dict[int, str] = {}  # each signal's phase: HOLD, WATCH or EXIT
        self.held: Trigger | None = None  # the first signal since hold(), not yet handed to a run
        self._timer: threading.Timer | None = None
        self._expired = False
        self._lease: Lease | None = None  # the run watching now
        self._restoring: int | None = None  # the signal release() interrupted the main thread with

    def role(self, signum: int) -> str | None:
        """The phase of the owner's handler for ``signum`` (``"hold"``, ``"watch"``, ``"exit"``), or None."""
        return self._role.get(signum) if signal.getsignal(signum) == self._handle else None

    # -- held: from restart() ----------------------------------------------------------------------------------
    def hold(self, signals: Iterable[int]) -> list[str]:
        """Catch each of ``signals`` whose handler is the default, until a run watches; the names held."""
        if not _main():
            return []
        self._settle()
        for signum in signals:
            if signum not in self._role and signal.getsignal(signum) in _UNSET:
                self._install(signum, HOLD)
        return [_name(s) for s, role in self._role.items() if role == HOLD]

    def _expire(self) -> None:
        held = self.held
        if held is not None and held.signum is not None and self._role.get(held.signum) == HOLD:
            self._expired = True
            logger.warning(
                f"{held.reason} came before training started and no fit began within "
                f"{HOLD_GRACE_S:g} s: the signal takes its default action now"
            )
            os.kill(os.getpid(), held.signum)  # its handler runs on the main thread

    # -- watched: a run -------------------------------------------------------------------------------------
    def watch(
        self,
        signals: Iterable[int],
        listener: Callable[[Trigger], None],
        *,
        on_exit: Callable[[int], None] | None = None,
        watchdog: Any = None,
    ) -> Lease:
        """A run begins: ``signals`` go to ``listener``; with ``on_exit`` (called with the signal first) SIGTERM,
        if not among them, becomes ``SystemExit``; ``watchdog`` is armed. Hand the lease to :meth:`end`."""
        signals = tuple(signals)
        lease = Lease(listener=listener, on_exit=on_exit, watchdog=watchdog)
        if not _main():
            if signals:
                logger.warning("preemption signals are caught on the main thread only; this fit runs on another")
        elif self._lease is not None and not self._lease.released:  # a run inside a run: the outer one keeps them
            lease.left_alone = [_name(s) for s in signals]
        else:
            self._watch(lease, signals)
        if watchdog is not None:
            watchdog.arm()
        return lease

    def _watch(self, lease: Lease, signals: tuple[int, ...]) -> None:
        self._settle()
        for signum in signals:
            if self._role.get(signum) == HOLD or (signum not in self._role and signal.getsignal(signum) in _TAKEN):
                self._install(signum, WATCH)
                lease.caught.append(_name(signum))
            else:
                lease.left_alone.append(_name(signum))
        held, self.held, self._expired = self.held, None, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for signum in [s for s, role in self._role.items() if role == HOLD]:
            self._put_back(signum)  # held for a run that does not watch it
        if held is not None and held.signum is not None and held.signum not in signals:
            signal.raise_signal(held.signum)  # as if it came now: its handler from before takes it
            held = None
        sigterm = int(signal.SIGTERM)
        if lease.on_exit is not None and sigterm not in self._role and signal.getsignal(sigterm) is signal.SIG_DFL:
            self._install(sigterm, EXIT)
            lease.exits = True
        self._lease, lease.held = lease, held
        if held is not None and lease.listener is not None:
            lease.listener(held)

    # -- after: every handler back ----------------------------------------------------------------------------
    def end(self, lease: Lease, *, watchdog: bool = True) -> None:
        """The run ended: every handler comes back (on the main thread; from another, as :meth:`release` does),
        and its watchdog stops (unless ``watchdog`` is False: the run's last meetings are still watched, and
        :meth:`release` stops it when the run lets go of its lock)."""
        if watchdog and lease.watchdog is not None:
            lease.watchdog.disarm()
        if lease is not self._lease:
            return
        if not _main():
            self._hand_back(lease)
            return
        self._lease = None
        self.teardown(deliver=False)

    def release(self, lease: Lease) -> None:
        """From any thread, when the run let go (``fit`` raised, or the lock's release after the end): its watchdog
        stops, and handlers still in place are put back by the main thread, interrupted to run ours."""
        if lease.watchdog is not None:
            lease.watchdog.disarm()
        self._hand_back(lease)

    def _hand_back(self, lease: Lease) -> None:
        lease.released = True
        if lease is self._lease and self._role:
            # Prefer a signal whose handler from before is no Python one: a late interrupt there does nothing.
            plain = [s for s in self._role if self._previous.get(s) in (signal.SIG_DFL, signal.SIG_IGN)]
            self._restoring = (plain or list(self._role))[0]
            _thread.interrupt_main(self._restoring)  # ``_thread.interrupt_main`` runs our handler there

    def teardown(self, deliver: bool = True) -> None:
        """Put back every handler the owner replaced (main thread; elsewhere nothing happens). A signal still
        held (no run took it) is delivered to its handler from before when ``deliver``, as if it came now."""
        if not _main():
            return
        held, self.held, self._expired = self.held, None, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lease, self._lease = self._lease, None
        if lease is not None and lease.watchdog is not None:
            lease.watchdog.disarm()
        for signum in list(self._role):
            self._put_back(signum)
        if held is not None and held.signum is not None and deliver:
            signal.raise_signal(held.signum)

    def _settle(self) -> None:
        """A released run's handlers, still in place (its interrupt not yet run), are put back now."""
        if self._lease is not None and self._lease.released:
            self.teardown(deliver=False)

    # -- the handlers ---------------------------------------------------------------------------------------
    def _install(self, signum: int, role: str) -> None:
        if signum not in self._role:
            self._previous[signum] = signal.signal(signum, self._handle)
        self._role[signum] = role

    def _put_back(self, signum: int) -> None:
        role, previous = self._role.pop(signum, None), self._previous.pop(signum, None)
        if signum == self._restoring:
            self._restoring = None  # its interrupt, if still pending, now reaches the handler from before
        if role is not None and signal.getsignal(signum) == self._handle:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    def forked(self) -> None:
        """In a child forked from this process (a ``multiprocessing`` pool's worker): every handler from before
        comes back, and nothing of the parent's run stays. The child runs none of our runs: our handler would
        keep a SIGTERM from ending it (``Pool.terminate`` ends its workers so, and would wait for them forever)."""
        self._timer, self._lease, self.held, self._expired, self._restoring = None, None, None, False, None
        for signum in list(self._role):
            self._role.pop(signum)
            previous = self._previous.pop(signum, None)
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    def _handle(self, signum: int, frame: object) -> None:
        """The one handler: what a signal does depends on its phase (main thread only, as Python runs them)."""
        lease, role = self._lease, self._role.get(signum)
        if signum == self._restoring:  # the interrupt release() asked for (a real signal now merges into it)
            self._restoring = None
            if lease is not None and lease.released:
                self.teardown(deliver=False)
            return
        if lease is not None and lease.released:  # after the run: the handler from before takes it
            self.teardown(deliver=False)
            signal.raise_signal(signum)
        elif role == HOLD:
            self._held(signum)
        elif role == WATCH and lease is not None and lease.listener is not None:
            # Only a record: the save happens at the next step boundary, on the training thread.
            lease.listener(Trigger(_name(signum), signum, time.monotonic()))
        elif role == EXIT and lease is not None:
            # A second SIGTERM (an impatient scheduler) kills at once, as it would have.
            self._put_back(signum)
            if lease.on_exit is not None:
                lease.on_exit(signum)
            raise SystemExit(128 + signum)

    def _held(self, signum: int) -> None:
        if self._expired:  # no run took it in time: the default action, as without candle_ckpt
            held = self.held
            self.teardown(deliver=False)
            signal.raise_signal(held.signum if held is not None and held.signum is not None else signum)
        elif self.held is None:
            self.held = Trigger(_name(signum), signum, time.monotonic())
            self._timer = threading.Timer(HOLD_GRACE_S, self._expire)
            self._timer.daemon = True
            self._timer.start()


_PROCESS = SignalOwner()
os.register_at_fork(after_in_child=_PROCESS.forked)


def process_signals() -> SignalOwner:
    """This process's owner: one table of handlers, one owner (``restart()`` holds, each run watches)."""
    return _PROCESS


def hold_signals(cfg: CkptConfig) -> list[str]:
    """From ``restart()`` until a run begins: hold the preemption signals for the run's first step.

    Returns the names of the signals held (none with checkpointing off, off the main thread, or where the
    program installed its own handler). See :meth:`~candle_ckpt.engine.signals.SignalOwner.hold`.
    """
    if checkpointing_off(cfg):
        return []
    return process_signals().hold(signal_numbers(cfg.preempt_signals))


__all__ = ["EXIT", "HOLD", "HOLD_GRACE_S", "WATCH", "Lease", "SignalOwner", "hold_signals", "process_signals"]
