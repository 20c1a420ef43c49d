"""Notice the end of a ``fit`` call, however it ends.

Keras calls ``on_train_end`` only when ``fit`` returns normally. When ``fit``
raises (an error in a training step, in another callback, Ctrl-C), no callback
hook runs again, and a callback that holds the directory's writer lock would
keep it until the process exits: the CLI, a new callback or a notebook's next
cell would be refused. :class:`FitGuard` watches the frame of the running
``fit`` from a daemon thread and calls ``on_exit`` once that frame has left
the training thread's stack. It knows nothing about Keras: the adapter hands
it the hook's frame and the file names of the framework's callback dispatcher
(from its gateway, :mod:`candle_ckpt.keras.internals` or
:mod:`candle_ckpt.tf_keras.internals`), and "the fit" is the first frame above
the hook that is not the dispatcher's nor a callback's.

The watching thread holds no strong reference to the fit's frame nor to the
callback (only the frame's id and code, and a weak reference to ``on_exit``).
Otherwise the last reference to the frame's locals (the model, the batches)
would be dropped on that thread when it ends, perhaps while the interpreter
shuts down, and a framework's destructor that lets go of the GIL there aborts
the process (JAX: "FATAL: exception not rethrown", exit 134 instead of 143).
Nor does it call ``on_exit`` once the main thread has finished: the process is
exiting, the atexit join commits the write in flight and the kernel drops the lock.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from types import CodeType, FrameType


def _is_callback(obj: object) -> bool:
    """Duck-typed: a callback or a callback list (it has the hooks and ``set_model``); a model has not."""
    return callable(getattr(obj, "on_train_begin", None)) and callable(getattr(obj, "set_model", None))


def _fit_frame(start: FrameType | None, dispatch_files: tuple[str, ...], owner: object = None) -> FrameType | None:
    """The first frame at or above ``start`` that is not part of the callback machinery: a framework's
    callback dispatcher, a method of ``owner`` (a subclass's hook calling ``super()``), or any other
    callback's method (a user's callback that forwards its hooks to ours)."""
    frame = start
    while frame is not None and (
        os.path.basename(frame.f_code.co_filename) in dispatch_files
        or (owner is not None and frame.f_locals.get("self") is owner)
        or _is_callback(frame.f_locals.get("self"))
    ):
        frame = frame.f_back
    return frame


def _on_stack(target_id: int, code: CodeType, thread_id: int) -> bool:
    """Whether the frame with this id and code is on the thread's stack (a frame on a stack keeps its id).

    CPython 3.11 can hand another thread's walker a stale object while that thread pushes and pops frames
    (a generator where a frame was: seen once in a loaded suite run; python/cpython#111363): anything but a
    frame on the way counts as "still running", so a misread never ends a fit that runs.
    """
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if not isinstance(frame, FrameType):
            return True
        if id(frame) == target_id and frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _weak(on_exit: Callable[[], None]) -> Callable[[], Callable[[], None] | None]:
    """A weak reference to a bound method (the callback's), a plain reference to anything else."""
    if getattr(on_exit, "__self__", None) is not None:
        return weakref.WeakMethod(on_exit)  # type: ignore[arg-type]
    return lambda: on_exit


def _watch(
    target_id: int,
    code: CodeType,
    thread_id: int,
    stop: threading.Event,
    on_exit: Callable,
    poll_s: float,
    turn: threading.Lock,
) -> None:
    main = threading.main_thread()
    missed = 0  # the fit must be seen gone twice in a row: one misread of the stack never releases
    while not stop.wait(poll_s):
        missed = 0 if _on_stack(target_id, code, thread_id) else missed + 1
        if missed >= 2:
            if thread_id == main.ident and not main.is_alive():
                return  # the interpreter is exiting: leave the rest to the atexit hooks and the kernel
            action = on_exit()
            # ``turn``: disarm() (a new fit's on_train_begin) waits for an action under way, and an action
            # never starts once disarmed: the release of the fit that raised never lands in the next fit.
            with turn:
                if action is not None and not stop.is_set():
                    action()
            return


class FitGuard:
    """Calls ``on_exit`` once, on a daemon thread, when the guarded ``fit`` has ended.

    Args:
        on_exit: What to do when ``fit`` ended without :meth:`disarm` (it raised).
        dispatch_files: File names (no folder) of the framework's callback dispatcher.
        poll_s: How often the thread looks at the training thread's stack.
    """

    def __init__(self, on_exit: Callable[[], None], dispatch_files: tuple[str, ...], poll_s: float = 0.2) -> None:
        self.on_exit = on_exit
        self.dispatch_files = tuple(dispatch_files)
        self.poll_s = poll_s
        # The callback whose hooks arm this guard (on_exit's object): its own frames are not the fit.
        self._owner = getattr(on_exit, "__self__", None)
        self._stop: threading.Event | None = None
        self._turn = threading.Lock()  # the watcher's action and disarm() never overlap

    def arm(self, hook_frame: FrameType) -> None:
        """Start watching the ``fit`` that called the hook whose frame is ``hook_frame`` (running now)."""
        self.disarm()
        target = _fit_frame(hook_frame.f_back, self.dispatch_files, self._owner)
        if target is None:
            return
        stop = self._stop = threading.Event()
        # Not the frame itself, nor self.on_exit: see the module docstring.
        args = (id(target), target.f_code, threading.get_ident(), stop, _weak(self.on_exit), self.poll_s, self._turn)
        threading.Thread(target=_watch, args=args, name="candle_ckpt-fit-guard", daemon=True).start()

    def disarm(self) -> None:
        """Stop watching: ``fit`` ended normally (``on_train_end``) and cleaned up itself.

        Returns once a release the watcher already started has finished; none starts after.
        """
        if self._stop is not None:
            with self._turn:
                self._stop.set()
            self._stop = None
