"""Where a callback meets the rest of ``model.fit``: its sibling callbacks and the input.

Keras gives a callback its model, not the ``CallbackList`` it sits in nor
the epoch iterator that feeds the model. Both are found here, once, when
``fit`` calls ``on_train_begin``: the ``CallbackList`` is the ``self`` of
the calling frame, and Keras 3's TensorFlow ``fit`` keeps the iterator in
its local ``epoch_iterator``. These are Keras internals;
``tests/integration/test_exact_resume.py::test_fit_hooks_find_the_callback_list_and_the_input``
fails loudly if a Keras release moves them. When they cannot be found the
callback falls back to saving in its own ``on_epoch_end`` and says what that
costs (see :mod:`candle_ckpt.keras.callback`).

The ``CallbackList`` gets two instance attributes that wrap its
``on_epoch_begin`` and ``on_epoch_end`` (the list's order and every other
callback are untouched): the checkpoint of epoch N is taken after *every*
callback's ``on_epoch_end`` for epoch N, whatever the order of the list,
and the saved state of a resumed run is put back after every callback's
``on_train_begin`` and before the first ``on_epoch_begin``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_MARK = "_candle_ckpt_hooked"
_DEPTH = 8  # frames searched above on_train_begin


def find_callback_list(callback: Any) -> Any:
    """The ``CallbackList`` that is calling ``callback.on_train_begin`` now, or None."""
    frame = sys._getframe(1)
    for _ in range(_DEPTH):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        members = getattr(owner, "callbacks", None)
        if isinstance(members, list) and any(c is callback for c in members) and hasattr(owner, "on_epoch_end"):
            return owner
    return None


def find_epoch_iterator(model: Any) -> Any:
    """The epoch iterator of the ``fit`` of ``model`` that is running now, or None."""
    frame = sys._getframe(1)
    for _ in range(_DEPTH + 2):
        frame = frame.f_back
        if frame is None:
            return None
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            it = frame.f_locals.get("epoch_iterator")
            return it if hasattr(it, "data_adapter") else None
    return None


def wrap_epoch_hooks(
    callback_list: Any, owner: Any, before_begin: Callable[[int], None], after_end: Callable[[int], None]
) -> bool:
    """Run ``before_begin(epoch)`` before every callback's ``on_epoch_begin`` and
    ``after_end(epoch)`` after every callback's ``on_epoch_end``.

    Returns False (and wraps nothing) if another owner already wrapped this list.
    """
    current = getattr(callback_list, _MARK, None)
    if current is not None:
        return current is owner
    begin, end = callback_list.on_epoch_begin, callback_list.on_epoch_end

    def on_epoch_begin(epoch: int, logs: Any = None) -> None:
        before_begin(epoch)
        begin(epoch, logs)

    def on_epoch_end(epoch: int, logs: Any = None) -> None:
        end(epoch, logs)
        after_end(epoch)

    callback_list.on_epoch_begin = on_epoch_begin
    callback_list.on_epoch_end = on_epoch_end
    setattr(callback_list, _MARK, owner)
    return True
