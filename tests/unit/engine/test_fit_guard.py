"""The fit guard's watcher thread: it notices a fit that raised, and keeps nothing of the fit alive.

Keeping the fit's frame (or the callback) alive from the watcher would make that
thread drop the last reference to the model and its batches, perhaps while the
interpreter exits: under JAX that aborted the process (exit 134, not 143). The
watcher reads no other thread's stack (CPython 3.11 can misread it, see
candle_ckpt.engine.fit_port): a fit ends when its CallbackList dies, or when the
thread that ran it sees it is no longer on its own stack.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref

import pytest
from fake_callback_list import Calls, find_fit

from candle_ckpt.engine.fit_port import FitGuard, notice_ended_fits

GUARD = "candle_ckpt-fit-guard"


class Owner:
    """Stands in for the callback: its hook arms the guard, and it records where ``on_exit`` ran."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.guard = FitGuard(self.fit_ended)

    def fit_ended(self) -> None:
        self.ended.append(threading.current_thread().name)

    def on_train_begin(self) -> None:
        self.guard.arm(find_fit(self))


class Batch:
    """A local of the fit (Keras's fit holds the model and the batches): records the thread that frees it."""

    def __init__(self, freed_on: list[str]) -> None:
        self.freed_on = freed_on

    def __del__(self) -> None:
        self.freed_on.append(threading.current_thread().name)


def fit_that_raises(owner: Owner, freed_on: list[str]) -> None:
    batch = Batch(freed_on)  # noqa: F841 -- held by this frame, as Keras's fit holds its data
    calls = Calls(owner)  # Keras's fit holds its CallbackList the same way, in a local
    calls.on_train_begin()
    raise RuntimeError("boom")


def kept_error_of_a_weak_owner(owner: weakref.ref) -> RuntimeError:
    """kept_error, with a fit that holds the callback weakly (Keras's CallbackList holds it strongly)."""

    def fit() -> None:
        calls = Calls(weakref.proxy(owner()))
        calls.on_train_begin()
        raise RuntimeError("boom")

    try:
        fit()
    except RuntimeError as error:
        return error
    raise AssertionError("fit did not raise")


def kept_error(owner: Owner, freed_on: list[str]) -> RuntimeError:
    """A fit that raised, its exception kept (a notebook's sys.last_value): its frame and locals live on."""
    try:
        fit_that_raises(owner, freed_on)
    except RuntimeError as error:
        return error
    raise AssertionError("fit_that_raises did not raise")


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
    """A callback dropped while its fit's exception is kept is freed at once; when the fit's CallbackList dies
    later, the guard thread ends without calling anything."""
    errors: list[BaseException] = []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        before = set(guard_threads())
        owner = Owner()
        error = kept_error_of_a_weak_owner(weakref.ref(owner))
        started = [t for t in guard_threads() if t not in before]
        ref = weakref.ref(owner)
        del owner
        gc.collect()
        assert ref() is None
        assert len(started) == 1 and started[0].is_alive()  # the fit's CallbackList lives in the kept error
        del error
        started[0].join(20)
        assert not started[0].is_alive() and errors == []
    finally:
        threading.excepthook = hook


def test_a_kept_error_keeps_the_fit_until_its_own_thread_looks():
    """The exception kept (a notebook): the fit's frame lives on, so nothing happens until the thread that
    ran it (a writer of this process finding the lock taken) sees that the fit is no longer on its stack."""
    owner, freed_on = Owner(), []
    error = kept_error(owner, freed_on)
    time.sleep(0.2)
    assert owner.ended == [] and freed_on == []
    seen: list[str] = []
    elsewhere = threading.Thread(target=lambda: (notice_ended_fits(), seen.append("looked")))
    elsewhere.start()
    elsewhere.join(20)
    time.sleep(0.2)
    assert seen == ["looked"] and owner.ended == []  # another thread cannot tell, and does not guess
    notice_ended_fits()
    wait_until(lambda: owner.ended)
    assert owner.ended == [GUARD]
    del error
    assert freed_on == [threading.current_thread().name]


def test_a_running_fit_is_not_ended_by_a_look_from_inside_it():
    """A writer opened inside the running fit (a callback's) looks from a thread where fit is on the stack."""
    owner = Owner()

    def fit() -> None:
        calls = Calls(owner)
        calls.on_train_begin()
        notice_ended_fits()  # from inside the fit, as a callback of this fit would
        time.sleep(0.2)
        assert owner.ended == []
        owner.guard.disarm()

    fit()
    time.sleep(0.1)
    assert owner.ended == []


def test_disarm_before_the_fit_ends_means_no_call():
    """A fit that ended normally disarms the guard (on_train_end): on_exit is never called."""
    owner = Owner()

    def fit() -> None:
        calls = Calls(owner)
        calls.on_train_begin()
        owner.guard.disarm()
        del calls

    fit()
    time.sleep(0.1)
    assert owner.ended == []


EXITING = """
import atexit, os, sys, time
sys.path.insert(0, os.environ["FAKE_LIST_DIR"])
from fake_callback_list import Calls, find_fit
from candle_ckpt.engine.fit_port import FitGuard

def on_exit():
    print("on_exit ran", flush=True)

guard = FitGuard(on_exit)

class Callback:
    def on_train_begin(self):
        guard.arm(find_fit(self))

def fit():
    calls = Calls(Callback())
    calls.on_train_begin()
    raise SystemExit(143)

atexit.register(time.sleep, 1.0)  # an atexit join that takes a while: the guard is awake meanwhile
if sys.argv[1] == "caught":
    try:
        fit()
    except SystemExit:
        pass
    time.sleep(1.0)
else:
    fit()
"""


@pytest.mark.parametrize(("how", "status", "released"), [("uncaught", 143, False), ("caught", 0, True)])
def test_no_call_while_the_interpreter_exits(how: str, status: int, released: bool):
    """A fit ended by SystemExit: the guard leaves the lock to the kernel; the process exits with its code.
    (The same SystemExit caught, the process going on: the guard releases.)"""
    env = {**os.environ, "FAKE_LIST_DIR": os.path.dirname(__file__)}
    proc = subprocess.run([sys.executable, "-c", EXITING, how], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == status, proc.stderr
    assert ("on_exit ran" in proc.stdout) is released


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
    calls = Calls(owner)
    calls.on_train_begin()  # the next fit: arm() disarms the old watcher first
    assert owner.ended == ["start", "end"]  # the release finished before the next fit went on
    owner.guard.disarm()

    quiet = Owner()
    error = kept_error(quiet, [])  # the fit's CallbackList lives on: the watcher has not woken
    quiet.guard.disarm()
    del error  # the list dies now: nothing is released afterwards
    time.sleep(0.5)
    assert quiet.ended == []


def test_the_lock_asks_the_hooks_before_refusing_a_holder_in_this_process(tmp_path, monkeypatch):
    """storage/lock.py imports no fit guard: a writer that finds the lock held by this process calls the hooks
    registered with it (the guard's notice_ended_fits is one), then waits for the holder to let go; with no hook
    that frees it, the second writer is refused, naming this process."""
    from candle_ckpt.core.errors import DirectoryLocked
    from candle_ckpt.storage import lock as lockmod

    assert notice_ended_fits in lockmod._HELD_HERE_HOOKS  # the guard registered itself on import
    monkeypatch.setattr(lockmod, "_HELD_HERE_HOOKS", [])
    path = str(tmp_path / "lock")
    first, second = lockmod.WriterLock(path), lockmod.WriterLock(path)
    first.acquire()
    asked: list[str] = []
    lockmod.on_held_by_this_process(lambda: (asked.append("asked"), first.release()))
    assert second.acquire() and second.held and asked == ["asked"]
    monkeypatch.setattr(lockmod, "_HELD_HERE_HOOKS", [])
    with pytest.raises(DirectoryLocked, match="another writer in this same process holds it"):
        lockmod.WriterLock(path).acquire(wait_same_process_s=0.1)
    second.release()
