"""Notice the end of a ``fit`` call, however it ends.

Keras calls ``on_train_end`` only when ``fit`` returns normally. When ``fit``
raises (an error in a training step, in another callback, Ctrl-C), no callback
hook runs again, and a callback that holds the directory's writer lock would
keep it until the process exits: the CLI, a new callback or a notebook's next
cell would be refused. :class:`FitGuard` calls ``on_exit`` once, on its own
daemon thread, when the guarded ``fit`` has ended without :meth:`FitGuard.disarm`.

It reads no other thread's stack (CPython 3.11 can hand such a reader a stale
object while that thread pushes and pops frames, python/cpython#111363: a
misread ended a running fit, or crashed the process). Two signals, each given on
the thread that owns what it looks at, end a fit instead:

* the death of the fit's ``CallbackList`` (a local of ``fit`` that nothing of
  ours holds strongly): a ``weakref.finalize`` wakes the watcher. It dies as
  ``fit``'s frame does, when ``fit`` returns or once the exception that ended
  it is let go;
* :func:`notice_ended_fits`, called by a writer of this process that finds the
  lock taken: on the thread that ran ``fit``, that thread's own stack tells
  whether ``fit`` is still on it.

Both are found by the framework's port (:class:`~candle_ckpt.engine.fit_port.FitPort`):
its gateway reads the stack of the hook that arms the guard (the list, and the
fit's frame, kept as an id and a code object), and its probe reads the stack of
the thread that asks. No module of the engine reads a frame
(``tests/unit/test_architecture.py``). This covers an exception that is kept (a
  notebook's ``sys.last_value``, ``pytest.raises(...) as info``), which keeps
  ``fit``'s frame, and so its locals, alive.

The watcher holds no strong reference to the fit's frame, to the object it
watches, nor to the callback (a weak reference to ``on_exit``). Otherwise the
last reference to the fit's locals (the model, the batches) would be dropped on
that thread, perhaps while the interpreter shuts down, and a framework's
destructor that lets go of the GIL there aborts the process (JAX: "FATAL:
exception not rethrown", exit 134 instead of 143). Nor does it call ``on_exit``
once the main thread has finished: the process is exiting, the atexit join
commits the write in flight and the kernel drops the lock.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from candle_ckpt.storage.lock import on_held_by_this_process


class FoundFit(NamedTuple):
    """A running ``fit`` as its framework's port found it from a callback's hook (the stack is read there, in
    the framework's gateway, never here)."""

    callback_list: Any
    """The fit's ``CallbackList``, whose death ends the guarded fit (None: not found)."""
    on_stack: Callable[[], bool]
    """Whether the fit is still on the calling thread's stack; asked on the fit's own thread only. It holds no
    reference to a frame (a frame's id and code)."""


def weakly_bound(obj: object, name: str) -> Callable[..., Any]:
    """``obj.<name>`` as it is now, for a wrapper stored on ``obj`` itself: the class's method called with a weak
    reference to ``obj`` (a bound method stored on ``obj`` is a cycle that keeps a ``CallbackList`` alive until a
    full garbage collection, and its death is what ends the guarded fit); an instance attribute already there
    (another library's wrapper) is returned as it is."""
    own = vars(obj).get(name)
    if own is not None:
        return own
    method, ref = getattr(type(obj), name), weakref.ref(obj)
    return lambda *args: method(ref(), *args)


class _Fit:
    """One guarded fit, as the watcher knows it: its thread, its port's probe of that thread's stack, two flags."""

    def __init__(self, on_stack: Callable[[], bool], thread_id: int) -> None:
        self.on_stack, self.thread_id = on_stack, thread_id
        # The watcher waits here. A SimpleQueue's put may run in a finalizer, on any thread, inside a garbage
        # collection (an Event's set takes a lock that thread may already hold).
        self.wake: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.noticed = False  # notice_ended_fits() woke it
        self.disarmed = False
        self.finalizer: weakref.finalize | None = None


_FITS: weakref.WeakSet[_Fit] = weakref.WeakSet()  # the armed fits (each kept alive by its watcher)


def notice_ended_fits() -> None:
    """Wake the guard of every fit that ran on the calling thread and is no longer on its stack.

    For a writer of this process that finds the lock taken (:meth:`candle_ckpt.storage.lock.WriterLock.acquire`):
    after a ``fit`` raised and its exception is kept, a notebook's next cell runs on the same thread.
    """
    me = threading.get_ident()
    for fit in list(_FITS):
        if fit.thread_id == me and not fit.noticed and not fit.on_stack():
            fit.noticed = True
            fit.wake.put("left the stack")


on_held_by_this_process(notice_ended_fits)  # a writer that finds the lock taken by this process asks first


def _weak(on_exit: Callable[[], None]) -> Callable[[], Callable[[], None] | None]:
    """A weak reference to a bound method (the callback's), a plain reference to anything else."""
    if getattr(on_exit, "__self__", None) is not None:
        return weakref.WeakMethod(on_exit)  # type: ignore[arg-type]
    return lambda: on_exit


def _watch(fit: _Fit, on_exit: Callable, turn: threading.Lock) -> None:
    fit.wake.get()
    main = threading.main_thread()
    # A fit ended by SystemExit on the main thread lets go of its frame after the main thread is marked done.
    if fit.disarmed or (fit.thread_id == main.ident and not main.is_alive()):
        return  # ended normally, or the interpreter is exiting: leave the rest to the atexit hooks and the kernel
    action = on_exit()
    # ``turn``: disarm() (a new fit's on_train_begin) waits for an action under way, and an action
    # never starts once disarmed: the release of the fit that raised never lands in the next fit.
    with turn:
        if action is not None and not fit.disarmed:
            action()


class FitGuard:
    """Calls ``on_exit`` once, on a daemon thread, when the guarded ``fit`` has ended without :meth:`disarm`.

    Args:
        on_exit: What to do when ``fit`` ended without :meth:`disarm` (it raised).
    """

    def __init__(self, on_exit: Callable[[], None]) -> None:
        self.on_exit = on_exit
        self._fit: _Fit | None = None
        self._turn = threading.Lock()  # the watcher's action and disarm() never overlap

    def arm(self, found: FoundFit | None) -> None:
        """Start guarding the ``fit`` running now on this thread, as its port ``found`` it from the hook
        (None: nothing to guard). Its ``CallbackList`` is watched; without one, only :func:`notice_ended_fits`
        ends the fit."""
        self.disarm()
        if found is None:
            return
        fit = self._fit = _Fit(found.on_stack, threading.get_ident())
        if found.callback_list is not None:
            fit.finalizer = weakref.finalize(found.callback_list, fit.wake.put, "died")
            fit.finalizer.atexit = False  # at interpreter exit: nothing to do (see the module docstring)
        _FITS.add(fit)
        # Not the list nor self.on_exit: see the module docstring.
        threading.Thread(
            target=_watch, args=(fit, _weak(self.on_exit), self._turn), name="candle_ckpt-fit-guard", daemon=True
        ).start()

    def disarm(self) -> None:
        """Stop guarding: ``fit`` ended normally (``on_train_end``) and cleaned up itself.

        Returns once a release the watcher already started has finished; none starts after.
        """
        fit, self._fit = self._fit, None
        if fit is not None:
            with self._turn:
                fit.disarmed = True
            if fit.finalizer is not None:
                fit.finalizer.detach()
            fit.wake.put("disarmed")  # the watcher wakes and ends
