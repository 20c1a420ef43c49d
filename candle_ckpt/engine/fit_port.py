"""The port of a framework's ``fit``, and fit's plumbing written once over it.

Keras gives a callback its model, not the ``CallbackList`` it sits in; it has
no hook for "after every callback's ``on_epoch_end``", no way to say "start
at epoch N", and no record of which callback stopped training. Each
framework's gateway reaches these in its own private way and offers them as
one small port, :class:`FitPort` (:mod:`candle_ckpt.keras.fit_internals` for
Keras 3, :mod:`candle_ckpt.tf_keras.internals` for tf_keras; each accessor
names its tripwire test). Only the gateways read stack frames
(``tests/unit/test_architecture.py``).

Over the port, :class:`FitPlumbing` (one per
:class:`~candle_ckpt.engine.run.TrainingRun`) writes once, for every front end:

- **the epoch order**: a front end's ``before_begin(epoch)`` runs before every
  callback's ``on_epoch_begin`` (a resumed fit's state is put back after every
  ``on_train_begin``), and its ``after_end(epoch, logs)`` after every
  callback's ``on_epoch_end`` (the save then holds ``EarlyStopping``'s
  decision and whatever the callbacks after it changed in that epoch),
  whatever the order of the list;
- **the finished-run rule** (:func:`~candle_ckpt.engine.finished.finished_line`):
  a finished run's rerun says so in one line and its ``fit`` starts past its
  last epoch, so it trains nothing;
- **where a resumed fit starts**: the first ``fit`` that trains after a restore starts after the restored epoch,
  whatever its ``initial_epoch`` (:meth:`FitPlumbing.trains`);
- **their undoing** when the run lets go (:meth:`FitPlumbing.release`).

The wrappers stored on the list hold it only weakly: a wrapper stored on the
list that held it would make a cycle, and the list would outlive ``fit`` until
a full garbage collection (its death is how the fit guard, below, learns
that a ``fit`` raised).

**The fit guard** notices the end of a ``fit`` call, however it ends.

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

Both are found by the framework's port (:class:`FitPort`):
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
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine import phases
from candle_ckpt.engine.finished import finished_line
from candle_ckpt.engine.resume import Resumed
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


_MARK = "_candle_ckpt_hooked"  # on a CallbackList: the owner whose epoch hooks wrap it


class FitPort(Protocol):
    """What a training run needs of its framework's ``fit``; a gateway module is one (its functions)."""

    def find_fit(self, callback: Any) -> FoundFit | None:
        """The ``fit`` calling ``callback``'s hook now (its ``CallbackList`` and a probe of its stack), or None."""

    def wrap_epoch(self, callback_list: Any, hooks: Mapping[str, Callable[..., None]]) -> None:
        """Make ``fit`` call ``hooks[name]`` where it calls the list's ``name`` (``on_epoch_begin``/``_end``)."""

    def set_first_epoch(self, model: Any, epoch: int | None) -> bool:
        """Make the ``fit`` of ``model`` that is starting begin at ``epoch`` (None: undo); False if another owns it."""

    def stopped_early(self, callback: Any, epoch: int) -> bool:
        """Whether ``callback`` ended training for good at epoch index ``epoch`` (an ``EarlyStopping``)."""


class FitPlumbing:
    """One run's plumbing of ``fit`` over its framework's ``port`` (None: a loop that is not ``fit``).

    Args:
        port: The framework's :class:`FitPort`, or None (``JobRunner``: only the finished rule applies).
        log: The job's log (the finished line).
    """

    def __init__(self, port: FitPort | None, log: OpsLog) -> None:
        self.port, self.log = port, log
        self._undo: list[Callable[[], None]] = []

    def find(self, callback: Any) -> FoundFit | None:
        """The ``fit`` calling ``callback``'s hook now, or None (no port, no callback, not found)."""
        if self.port is None or callback is None:
            return None
        return self.port.find_fit(callback)

    def hook_epochs(
        self,
        callback_list: Any,
        owner: Any,
        after_end: Callable[[int, Any], None],
        before_begin: Callable[[int], None] | None = None,
    ) -> bool:
        """The epoch order, once for every front end: ``after_end(epoch, logs)`` after every callback's
        ``on_epoch_end``; ``before_begin(epoch)`` (if given) before every callback's ``on_epoch_begin``.

        Returns False (nothing wrapped) when the list is None, there is no port, or another owner wrapped it.
        Undone by :meth:`release`.
        """
        if callback_list is None or self.port is None:
            return False
        current = getattr(callback_list, _MARK, None)
        if current is not None:
            return current is owner
        end = weakly_bound(callback_list, "on_epoch_end")

        def on_epoch_end(epoch: int, logs: Any = None) -> None:
            end(epoch, logs)
            after_end(epoch, logs)

        hooks: dict[str, Callable[..., None]] = {"on_epoch_end": on_epoch_end}
        if before_begin is not None:
            begin = weakly_bound(callback_list, "on_epoch_begin")

            def on_epoch_begin(epoch: int, logs: Any = None) -> None:
                before_begin(epoch)
                begin(epoch, logs)

            hooks["on_epoch_begin"] = on_epoch_begin
        self.port.wrap_epoch(callback_list, hooks)
        setattr(callback_list, _MARK, owner)
        ref = weakref.ref(callback_list)

        def undo() -> None:
            alive = ref()
            if alive is None:
                return
            for name, hook in hooks.items():
                if vars(alive).get(name) is hook:
                    delattr(alive, name)
            if vars(alive).get(_MARK) is owner:
                delattr(alive, _MARK)

        self._undo.append(undo)
        return True

    def stop_if_finished(
        self,
        resumed: Resumed | None,
        where: str,
        *,
        ended: tuple[str, int] | None,
        epochs: Any,
        restart_epoch: int | None = None,
        model: Any = None,
        call: str = "fit()",
        limit: str | None = None,
    ) -> bool:
        """The finished-run rule: if the run ``resumed`` is finished, say so in one line and return True; a
        ``fit`` (``model`` given) then starts at ``epochs``, so it runs no epoch (undone by :meth:`release`).

        ``ended``, ``epochs``, ``restart_epoch``, ``call``, ``limit``: as
        :func:`~candle_ckpt.engine.finished.finished_line`.
        """
        if resumed is None:
            return False
        side = resumed.sidecar
        line = finished_line(
            side, where, ended=ended, epochs=epochs, restart_epoch=restart_epoch, call=call, limit=limit
        )
        if line is None:
            return False
        self.log.warning(line)
        port = self.port
        if model is not None and port is not None and isinstance(epochs, int):
            if port.set_first_epoch(model, epochs):
                self._undo.append(lambda: port.set_first_epoch(model, None))
            else:
                self.log.warning("BackupAndRestore sets where this fit starts: it may train further")
        return True

    def trains(self, model: Any, resumed: Resumed | None, directory: str, where: str) -> None:
        """A ``fit`` of ``model`` that trains starts (not a finished run's rerun). The first after a restore
        (``resumed``, of the checkpoint ``where``) starts after the restored epoch whatever its ``initial_epoch``,
        as Keras's ``BackupAndRestore`` makes a fit start (undone by :meth:`release`; where another owner holds
        the seam, it sets the start itself). Then its optimizer is checked (:func:`.phases.check`)."""
        port, first = self.port, resumed is not None and resumed.pending.first_fit()
        if first and port is not None and resumed.sidecar.epoch and port.set_first_epoch(model, resumed.sidecar.epoch):
            self._undo.append(lambda: port.set_first_epoch(model, None))
        phases.check(model, directory, resumed.pending.loaded_into if first else None, where, self.log)

    def stopped_by(self, callbacks: list[Any], model: Any, epoch: int) -> str | None:
        """At the save of epoch index ``epoch``: the class of the callback that ended training for good, else None.

        Only an early stop counts (the port's ``EarlyStopping``): a callback that stops for the time budget
        (CANDLE's ``TerminateOnTimeOut``) or our own preemption stop leaves the run unfinished.
        """
        if self.port is None or not getattr(model, "stop_training", False):
            return None
        port = self.port
        return next((type(cb).__name__ for cb in callbacks if port.stopped_early(cb, epoch)), None)

    def release(self) -> None:
        """Undo what this run's fit was given: its epoch hooks and its first epoch (newest first)."""
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()
