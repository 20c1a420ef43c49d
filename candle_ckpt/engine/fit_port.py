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
- **their undoing** when the run lets go (:meth:`FitPlumbing.release`).

The wrappers stored on the list hold it only weakly: a wrapper stored on the
list that held it would make a cycle, and the list would outlive ``fit`` until
a full garbage collection (its death is how the fit guard learns that a
``fit`` raised, :mod:`candle_ckpt.engine.fit_guard`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.finished import finished_line
from candle_ckpt.engine.fit_guard import FoundFit, weakly_bound
from candle_ckpt.engine.resume import Resumed

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
