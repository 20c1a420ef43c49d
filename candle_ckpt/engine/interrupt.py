"""Ctrl-C during ``fit``: say once, in ``ckpt.log`` and on the console, what the last committed checkpoint is.

Python's KeyboardInterrupt and its traceback are the user's: nothing here catches or changes them, and no
signal handler is installed. A script that a Ctrl-C ended during ``fit`` prints Python's traceback and keeps
the exception (``sys.last_value``); at interpreter exit, after the traceback, one line says which checkpoint
the next ``restart()`` resumes from, once the write in flight (``ckpt_async``) has ended, as the exit hook
would have it.

One Ctrl-C is never lost. Python drops a KeyboardInterrupt raised where it cannot raise one (a ``__del__``, a
weakref or gc callback: "Exception ignored in ..."), and fit spends time in them (TensorFlow's finalizers at
an epoch's end): training went on as if no Ctrl-C had come (seen once in CI: the Quickstart trained for five
minutes after it). While a fit runs, a dropped one is kept (:attr:`InterruptNotice.dropped`, set by the
process's unraisable hook) and raised at the next step or epoch end, on the training thread.
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Callable
from typing import Any

from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.log import OpsLog, position
from candle_ckpt.storage.store import CheckpointStore


def last_committed(store: CheckpointStore) -> str:
    """The newest committed checkpoint a restart resumes from, in words: a step checkpoint committed after
    ``last`` (as ``restart()`` prefers it), else ``last``; or that there is none."""
    root = store.layout.root
    epoch = store.link_epoch("last")
    try:
        side = store.read_sidecar(epoch) if epoch is not None else None
    except CheckpointError:
        side = None
    generations = store.steps.generations()
    if generations and (side is None or generations[-1] > side.generation):
        try:
            step = store.steps.read_sidecar(generations[-1])
        except CheckpointError:
            step = None
        if step is not None:
            where = store.layout.step_dir(generations[-1])
            return f"the last committed checkpoint is {position(step.epoch, step.step)} ({where})"
    if epoch is None:
        return f"no checkpoint was committed in {root}: the next run starts from scratch"
    return f"the last committed checkpoint is {position(epoch)} ({store.layout.epoch_dir(epoch)})"


class InterruptNotice:
    """The Ctrl-C line of one callback's fits.

    Args:
        log: Where the line goes (``ckpt.log`` and the console logger).
        store: The directory's store, read for :func:`last_committed`.
        settle: Waits for the write in flight (bounded: ``ckpt_async_timeout``).
    """

    def __init__(self, log: OpsLog, store: CheckpointStore, settle: Callable[[], object]) -> None:
        self.log, self.store, self.settle = log, store, settle
        self._in_fit = False
        #: A KeyboardInterrupt Python dropped during the fit, not yet raised (the run's hooks read it each step).
        self.dropped: KeyboardInterrupt | None = None
        self._hook: Any = None  # the unraisable hook from before ours, while the fit runs

    def arm(self) -> None:
        """At ``fit``'s start: look, at interpreter exit, for a KeyboardInterrupt that ended it, and keep one that
        Python drops while the fit runs."""
        if not self._in_fit:
            self._in_fit = True
            atexit.register(self._at_exit)
        if self._hook is None:
            self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        self.dropped = None

    def _unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.dropped is None:
            self.dropped = unraisable.exc_value  # raised at the next step instead: no "Exception ignored" lines
        else:
            (self._hook or sys.__unraisablehook__)(unraisable)

    def raise_dropped(self) -> None:
        """Raise the KeyboardInterrupt Python dropped (on the training thread, between steps), saying so once."""
        dropped, self.dropped = self.dropped, None
        if dropped is not None:
            self.log.note("Ctrl-C: Python dropped the KeyboardInterrupt in a finalizer; raised at this step instead")
            raise KeyboardInterrupt from None

    def fit_returned(self) -> None:
        """The fit has returned: nothing to say at exit. (A fit that raised stays looked at: a Ctrl-C
        during a save ends the fit through the callback's own error path before it reaches the top.)"""
        if self._in_fit:
            self._in_fit = False
            atexit.unregister(self._at_exit)
        self.unhook()

    def unhook(self) -> None:
        """The fit has ended (returned or raised): the unraisable hook from before comes back."""
        if self._hook is not None:
            if sys.unraisablehook == self._unraisable:
                sys.unraisablehook = self._hook
            self._hook = None

    def _at_exit(self) -> None:
        # A script that a Ctrl-C ended: Python has printed the traceback and kept the exception in
        # sys.last_value; this fit never ended (its frames live on in that traceback).
        if self._in_fit and isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
            self._in_fit = False
            try:
                self.settle()
            finally:  # the line is said even where the write in flight failed (its error is raised after it)
                self.log.warning(f"interrupted (Ctrl-C): {last_committed(self.store)}")
