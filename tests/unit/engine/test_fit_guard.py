"""The fit guard's watcher thread: it notices a fit that raised, and keeps nothing of the fit alive.

Keeping the fit's frame (or the callback) alive from the watcher would make that
thread drop the last reference to the model and its batches, perhaps while the
interpreter exits: under JAX that aborted the process (exit 134, not 143).
"""

from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import threading
import time
import weakref

from candle_ckpt.engine.fit_guard import FitGuard

GUARD = "candle_ckpt-fit-guard"


class Owner:
    """Stands in for the callback: its hook arms the guard, and it records where ``on_exit`` ran."""

    def __init__(self, poll_s: float = 0.01) -> None:
        self.ended: list[str] = []
        self.guard = FitGuard(self.fit_ended, (), poll_s=poll_s)

    def fit_ended(self) -> None:
        self.ended.append(threading.current_thread().name)

    def on_train_begin(self) -> None:
        self.guard.arm(inspect.currentframe())


class Batch:
    """A local of the fit (Keras's fit holds the model and the batches): records the thread that frees it."""

    def __init__(self, freed_on: list[str]) -> None:
        self.freed_on = freed_on

    def __del__(self) -> None:
        self.freed_on.append(threading.current_thread().name)


def fit_that_raises(owner: Owner, freed_on: list[str]) -> None:
    batch = Batch(freed_on)  # noqa: F841 -- held by this frame, as Keras's fit holds its data
    owner.on_train_begin()
    raise RuntimeError("boom")


def guard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == GUARD]


def wait_until(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_fit_that_raised_is_noticed_and_its_locals_die_on_the_training_thread():
    """on_exit runs on the guard thread; the fit's locals are freed by the thread that ran fit, not the guard."""
    owner, freed_on = Owner(), []
    try:
        fit_that_raises(owner, freed_on)
    except RuntimeError:
        pass
    assert freed_on == [threading.current_thread().name]  # at once: the guard holds no reference to the frame
    wait_until(lambda: owner.ended)
    assert owner.ended == [GUARD]


def test_the_guard_does_not_keep_the_callback_alive():
    """A callback dropped after its fit raised is freed at once; the guard thread then ends without calling it."""
    errors: list[BaseException] = []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        before = set(guard_threads())
        owner = Owner(poll_s=3.0)  # the guard has not looked yet when the callback is dropped
        try:
            fit_that_raises(owner, [])
        except RuntimeError:
            pass
        # Taken before gc.collect(), which can outlast the poll on a busy machine (the thread then ended already).
        started = [t for t in guard_threads() if t not in before]
        ref = weakref.ref(owner)
        del owner
        gc.collect()
        assert ref() is None
        assert len(started) == 1
        started[0].join(20)
        assert not started[0].is_alive() and errors == []
    finally:
        threading.excepthook = hook


def test_disarm_before_the_fit_ends_means_no_call():
    """A fit that ended normally disarms the guard (on_train_end): on_exit is never called."""
    owner = Owner()

    def fit() -> None:
        owner.on_train_begin()
        owner.guard.disarm()

    fit()
    time.sleep(0.1)
    assert owner.ended == []


EXITING = """
import atexit, inspect, sys, time
from candle_ckpt.engine.fit_guard import FitGuard

def on_exit():
    print("on_exit ran", flush=True)

guard = FitGuard(on_exit, (), poll_s=0.01)

def hook():
    guard.arm(inspect.currentframe())

def fit():
    hook()
    raise SystemExit(143)

atexit.register(time.sleep, 0.5)  # an atexit join that takes a while: the guard polls meanwhile
fit()
"""


def test_no_call_while_the_interpreter_exits():
    """A fit ended by SystemExit: the guard leaves the lock to the kernel; the process exits with its code."""
    proc = subprocess.run([sys.executable, "-c", EXITING], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr
    assert "on_exit ran" not in proc.stdout


class SlowOwner(Owner):
    """Its release takes a while (a close that joins a write): long enough for the next fit to begin."""

    def fit_ended(self) -> None:
        self.ended.append("start")
        time.sleep(0.3)
        self.ended.append("end")


def test_the_next_fit_waits_for_a_release_under_way_and_no_release_starts_after_it() -> None:
    """Issue 27's lock lost mid-fit: a fit raised, its release began on the watcher, and the same callback's
    next fit took the lock meanwhile. Now arming for the next fit returns only after that release has ended,
    and a guard disarmed before its watcher acts never releases anything."""
    owner = SlowOwner()
    try:
        fit_that_raises(owner, [])
    except RuntimeError:
        pass
    wait_until(lambda: owner.ended == ["start"])
    assert owner.ended == ["start"]
    owner.on_train_begin()  # the next fit: arm() disarms the old watcher first
    assert owner.ended == ["start", "end"]  # the release finished before the next fit went on
    owner.guard.disarm()

    quiet = Owner(poll_s=0.2)
    try:
        fit_that_raises(quiet, [])
    except RuntimeError:
        pass
    quiet.guard.disarm()  # before the watcher's first look: nothing is released afterwards
    time.sleep(0.5)
    assert quiet.ended == []
