"""Notice the end of a ``fit`` call, however it ends.

Keras calls ``on_train_end`` only when ``fit`` returns normally. When ``fit``
raises (an error in a training step, in another callback, Ctrl-C), no callback
hook runs again, and a callback that holds the directory's writer lock would
keep it until the process exits: the CLI, a new callback or a notebook's next
cell would be refused. :class:`FitGuard` watches the frame of the running
``fit`` from a daemon thread and calls ``on_exit`` once that frame has left
the training thread's stack. It knows nothing about Keras: "the fit" is the
first frame above the callback hook that is not the framework's callback list.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import FrameType

_CALLBACK_LIST_FILES = ("callback_list.py", "callbacks.py")


def _is_callback(obj: object) -> bool:
    """Duck-typed: a callback or a callback list (it has the hooks and ``set_model``); a model has not."""
    return callable(getattr(obj, "on_train_begin", None)) and callable(getattr(obj, "set_model", None))


def _fit_frame(start: FrameType | None, owner: object = None) -> FrameType | None:
    """The first frame at or above ``start`` that is not part of the callback machinery: a framework's
    callback dispatcher, a method of ``owner`` (a subclass's hook calling ``super()``), or any other
    callback's method (a user's callback that forwards its hooks to ours)."""
    frame = start
    while frame is not None and (
        os.path.basename(frame.f_code.co_filename) in _CALLBACK_LIST_FILES
        or (owner is not None and frame.f_locals.get("self") is owner)
        or _is_callback(frame.f_locals.get("self"))
    ):
        frame = frame.f_back
    return frame


def _on_stack(target: FrameType, thread_id: int) -> bool:
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


class FitGuard:
    """Calls ``on_exit`` once, on a daemon thread, when the guarded ``fit`` has ended.

    Args:
        on_exit: What to do when ``fit`` ended without :meth:`disarm` (it raised).
        poll_s: How often the thread looks at the training thread's stack.
    """

    def __init__(self, on_exit: Callable[[], None], poll_s: float = 0.05) -> None:
        self.on_exit = on_exit
        self.poll_s = poll_s
        # The callback whose hooks arm this guard (on_exit's object): its own frames are not the fit.
        self._owner = getattr(on_exit, "__self__", None)
        self._stop: threading.Event | None = None

    def arm(self, hook_frame: FrameType | None = None) -> None:
        """Start watching the ``fit`` that called the hook running now (called from the hook)."""
        self.disarm()
        hook = hook_frame or sys._getframe(1)
        target = _fit_frame(hook.f_back, self._owner)
        if target is None:
            return
        stop = self._stop = threading.Event()
        thread = threading.Thread(
            target=self._watch, args=(target, threading.get_ident(), stop), name="candle_ckpt-fit-guard", daemon=True
        )
        thread.start()

    def disarm(self) -> None:
        """Stop watching: ``fit`` ended normally (``on_train_end``) and cleaned up itself."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def _watch(self, target: FrameType, thread_id: int, stop: threading.Event) -> None:
        while not stop.wait(self.poll_s):
            if not _on_stack(target, thread_id):
                del target  # do not keep the finished fit's frame (and its locals) alive
                if not stop.is_set():
                    self.on_exit()
                return
