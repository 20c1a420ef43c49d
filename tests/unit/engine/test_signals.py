"""The one owner of signal handlers (engine/signals.py): held, watched, then every handler back in one teardown.

Each test makes its own SignalOwner (the process's one is left to the runs) and puts back what it changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from candle_ckpt.config.preemption import signal_numbers
from candle_ckpt.engine.preempt import PreemptionWatcher
from candle_ckpt.engine.signals import EXIT, WATCH, SignalOwner

USR1, USR2, TERM = int(signal.SIGUSR1), int(signal.SIGUSR2), int(signal.SIGTERM)


@pytest.fixture
def owner() -> Iterator[SignalOwner]:
    """A fresh owner; SIGUSR1, SIGUSR2 and SIGTERM get back the handlers they had."""
    before = {s: signal.getsignal(s) for s in (USR1, USR2, TERM)}
    made = SignalOwner()
    yield made
    made.teardown(deliver=False)
    for signum, handler in before.items():
        signal.signal(signum, handler)


class Dog:
    """A watchdog's arm/disarm, counted."""

    def __init__(self) -> None:
        self.armed = 0
        self.disarmed = 0

    def arm(self) -> None:
        self.armed += 1

    def disarm(self) -> None:
        self.disarmed += 1


def test_a_watched_signal_is_only_recorded_and_the_previous_handler_comes_back(owner: SignalOwner) -> None:
    """A signal only records its name and time; the run's end puts back the handler that was there before."""
    signal.signal(USR1, signal.SIG_IGN)
    watcher = PreemptionWatcher(signal_numbers(("SIGUSR1",)))
    lease = owner.watch(watcher.signals, watcher.notice)
    assert lease.caught == ["SIGUSR1"] and owner.role(USR1) == WATCH
    assert watcher.due() is None
    before = time.monotonic()
    os.kill(os.getpid(), USR1)
    got = watcher.due()
    assert got is not None and (got.reason, got.signum) == ("SIGUSR1", USR1)
    assert before <= got.at <= time.monotonic()
    owner.end(lease)
    assert signal.getsignal(USR1) is signal.SIG_IGN
    watcher.arm()
    assert watcher.pending is None, "a new fit starts without the old request"


def test_a_handler_the_program_installed_is_left_alone(owner: SignalOwner) -> None:
    """A Python handler the program installed is neither replaced nor removed; the lease names the signal."""

    def mine(signum, frame):
        pass

    signal.signal(USR2, mine)
    assert owner.hold([USR2]) == []
    lease = owner.watch([USR2], lambda trigger: None)
    assert lease.caught == [] and lease.left_alone == ["SIGUSR2"]
    assert signal.getsignal(USR2) is mine
    owner.end(lease)
    assert signal.getsignal(USR2) is mine


def test_sigterm_becomes_system_exit_once_and_only_when_not_watched(owner: SignalOwner) -> None:
    """With on_exit and SIGTERM no preemption signal, SIGTERM raises SystemExit(143) after on_exit, and its
    default action is back at once (a second SIGTERM kills); with SIGTERM watched, the watcher has it."""
    exits: list[int] = []
    lease = owner.watch([USR1], lambda trigger: None, on_exit=exits.append)
    assert lease.exits and owner.role(TERM) == EXIT
    with pytest.raises(SystemExit) as info:
        signal.raise_signal(TERM)
    assert info.value.code == 143 and exits == [TERM]
    assert signal.getsignal(TERM) is signal.SIG_DFL
    owner.end(lease)
    lease = owner.watch([TERM], lambda trigger: None, on_exit=exits.append)
    assert not lease.exits and owner.role(TERM) == WATCH
    owner.end(lease)
    assert signal.getsignal(TERM) is signal.SIG_DFL and signal.getsignal(USR1) is signal.SIG_DFL


def test_a_release_from_another_thread_puts_every_handler_back_on_the_main_thread(owner: SignalOwner) -> None:
    """fit raised: release() on another thread stops the watchdog at once and interrupts the main thread,
    whose run of our handler puts back both the watched signal and SIGTERM's exit."""
    dog = Dog()
    lease = owner.watch([USR1], lambda trigger: None, on_exit=lambda signum: None, watchdog=dog)
    assert dog.armed == 1 and owner.role(USR1) == WATCH and owner.role(TERM) == EXIT
    releaser = threading.Thread(target=owner.release, args=(lease,))
    releaser.start()
    releaser.join()
    assert dog.disarmed >= 1  # at once (and again by the main thread's teardown)
    for _ in range(100):  # the interrupt runs at the main thread's next check
        if signal.getsignal(USR1) is signal.SIG_DFL and signal.getsignal(TERM) is signal.SIG_DFL:
            break
        time.sleep(0.01)
    assert signal.getsignal(USR1) is signal.SIG_DFL and signal.getsignal(TERM) is signal.SIG_DFL


def test_a_signal_after_a_release_goes_to_the_handler_from_before(owner: SignalOwner) -> None:
    """After the run (released, its interrupt not yet run), a signal gets the handler from before, not a flag:
    here SIG_IGN, so the process lives on; with the default, a SIGTERM after fit ends it as without us."""
    signal.signal(USR1, signal.SIG_IGN)
    watcher = PreemptionWatcher([USR1])
    lease = owner.watch([USR1], watcher.notice)
    assert lease.caught == ["SIGUSR1"]
    lease.released = True  # as release() marks it, before its interrupt has run on this thread
    os.kill(os.getpid(), USR1)
    assert watcher.pending is None and signal.getsignal(USR1) is signal.SIG_IGN


def test_a_held_signal_is_handed_to_the_run_that_watches_it(owner: SignalOwner) -> None:
    """hold() keeps a SIGUSR1 (the process lives on); the run watching it gets it as its request at once."""
    assert owner.hold([USR1, USR2]) == ["SIGUSR1", "SIGUSR2"]
    signal.raise_signal(USR1)
    watcher = PreemptionWatcher([USR1])
    told: list[str] = []
    watcher.on_signal = lambda trigger: told.append(trigger.reason)
    lease = owner.watch([USR1], watcher.notice)
    assert lease.held is not None and watcher.pending is lease.held and told == ["SIGUSR1"]
    assert owner.role(USR2) is None and signal.getsignal(USR2) is signal.SIG_DFL
    owner.end(lease)
    assert signal.getsignal(USR1) is signal.SIG_DFL


def test_a_run_inside_a_run_leaves_the_outer_runs_signals_alone(owner: SignalOwner) -> None:
    """A second run while one watches catches nothing, and its end changes nothing of the outer run's."""
    outer = owner.watch([USR1], lambda trigger: None)
    dog = Dog()
    inner = owner.watch([USR1], lambda trigger: None, watchdog=dog)
    assert inner.caught == [] and inner.left_alone == ["SIGUSR1"] and dog.armed == 1
    owner.end(inner)
    assert owner.role(USR1) == WATCH and dog.disarmed == 1
    owner.end(outer)
    assert signal.getsignal(USR1) is signal.SIG_DFL


def test_off_the_main_thread_nothing_is_installed_but_the_watchdog_runs(owner: SignalOwner) -> None:
    """A run on another thread catches nothing (Python allows handlers on the main thread only)."""
    dog = Dog()
    leases = []
    thread = threading.Thread(target=lambda: leases.append(owner.watch([USR1], lambda t: None, watchdog=dog)))
    thread.start()
    thread.join()
    assert leases[0].caught == [] and dog.armed == 1 and signal.getsignal(USR1) is signal.SIG_DFL
    owner.end(leases[0])
    assert dog.disarmed == 1


_FORKED = """
import os, signal, sys, time
from candle_ckpt.config.preemption import signal_numbers
from candle_ckpt.engine.preempt import PreemptionWatcher
from candle_ckpt.engine.signals import process_signals
owner, TERM, USR1 = process_signals(), signal.SIGTERM, signal.SIGUSR1
watcher = PreemptionWatcher(signal_numbers(("SIGUSR1", "SIGTERM")))
if sys.argv[1] == "watched":
    owner.watch(watcher.signals, watcher.notice)
else:
    owner.hold((USR1, TERM))
assert owner.role(TERM) is not None
pid = os.fork()
if pid == 0:  # the child: what it has, then what a SIGTERM does to it
    if all(signal.getsignal(s) is signal.SIG_DFL for s in (USR1, TERM)) and owner.role(TERM) is None:
        os.kill(os.getpid(), TERM)
        time.sleep(5)
    os._exit(3)
_, status = os.waitpid(pid, 0)
print("child", "killed by SIGTERM" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == TERM else status,
      "parent", owner.role(TERM))
"""


@pytest.mark.parametrize("phase", ["held", "watched"])
def test_a_forked_child_gets_the_handlers_from_before_and_dies_of_a_sigterm(phase: str) -> None:
    """A child forked while the process's owner holds or watches SIGTERM (a multiprocessing pool's worker forked
    mid-fit) has the default handlers back, so the SIGTERM that ``Pool.terminate`` sends ends it; the parent keeps
    ours. Before, the child kept our handler, ignored the SIGTERM, and ``Pool.terminate`` waited for it forever."""
    done = subprocess.run([sys.executable, "-c", _FORKED, phase], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["child", "killed", "by", "SIGTERM", "parent", {"held": "hold"}.get(phase, "watch")]
