"""Where a callback meets the rest of ``model.fit``: its sibling callbacks and the input.

Keras gives a callback its model, not the ``CallbackList`` it sits in nor
the epoch iterator that feeds the model. Both are found here, once, when
``fit`` calls ``on_train_begin``: the ``CallbackList`` is the ``self`` of
the calling frame, and Keras 3's TensorFlow ``fit`` keeps the iterator in
its local ``epoch_iterator``. These are Keras internals;
``tests/integration/keras/test_resume_order.py::test_fit_hooks_find_the_callback_list_and_the_input``
fails loudly if a Keras release moves them. When they cannot be found the
callback falls back to saving in its own ``on_epoch_end`` and says what that
costs (see :mod:`candle_ckpt.keras.callback`).

A resumed ``fit`` that starts in the middle of an epoch (a step checkpoint)
has the epoch iterator's ``_enumerate_iterator`` wrapped for that one epoch
(:func:`skip_steps`): the steps already done are taken from it as ``fit``
would have taken them (their batches drawn, so the input and its RNGs move
exactly as in the uninterrupted run), and the step numbers, ``_steps_seen``
and everything after continue unchanged. The same tripwire test covers the
attributes it relies on.

The ``CallbackList`` gets two instance attributes that wrap its
``on_epoch_begin`` and ``on_epoch_end`` (the list's order and every other
callback are untouched): the checkpoint of epoch N is taken after *every*
callback's ``on_epoch_end`` for epoch N, whatever the order of the list,
and the saved state of a resumed run is put back after every callback's
``on_train_begin`` and before the first ``on_epoch_begin``.
"""

from __future__ import annotations

import sys
import time
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


def before_train_end(callback_list: Any, then: Callable[[], None]) -> None:
    """Run ``then()`` before every callback's ``on_train_end`` of this fit (a fit that runs no epoch)."""
    end = callback_list.on_train_end

    def on_train_end(logs: Any = None) -> None:
        del callback_list.on_train_end
        then()
        end(logs)

    callback_list.on_train_end = on_train_end


def skip_steps(epoch_iterator: Any, steps: int, consume: bool, then: Callable[[int, float], None]) -> None:
    """In the next epoch of ``epoch_iterator`` only, take its first ``steps`` steps before ``fit`` sees any.

    Args:
        epoch_iterator: The ``fit``'s epoch iterator (:func:`find_epoch_iterator`).
        steps: Training steps already done in this epoch (a multiple of ``steps_per_execution``).
        consume: Draw the batches of those steps (False: the input iterator
            was already put at that position, as a kept ``tf.data`` iterator is).
        then: Called with ``(steps skipped, seconds it took)`` once they are
            skipped, before the first batch that ``fit`` trains on.
    """
    original = epoch_iterator._enumerate_iterator
    per = max(int(getattr(epoch_iterator, "steps_per_execution", 1) or 1), 1)

    def enumerate_skipping() -> Any:
        del epoch_iterator._enumerate_iterator  # later epochs run as Keras wrote them
        start, done = time.perf_counter(), 0
        seen = epoch_iterator._steps_seen
        steps_gen = original()
        try:
            while done < steps:
                _, end, iterator = next(steps_gen)
                if consume:
                    for _ in range(per):
                        next(iterator)
                done = end + 1
        except (StopIteration, OutOfRange()):  # fewer steps than saved: the epoch ends here
            then(done, time.perf_counter() - start)
            return
        if not consume:
            epoch_iterator._steps_seen = seen
        then(done, time.perf_counter() - start)
        yield from steps_gen

    epoch_iterator._enumerate_iterator = enumerate_skipping


def OutOfRange() -> type[BaseException]:  # noqa: N802 -- used as an exception class in except clauses
    """TensorFlow's end-of-input error when TensorFlow is loaded, else StopIteration."""
    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    return getattr(tf_errors, "OutOfRangeError", StopIteration)


def set_first_epoch(model: Any, epoch: int | None) -> None:
    """Make the ``fit`` that is starting begin at ``epoch`` whatever its ``initial_epoch`` (None: undo).

    Relies on the trainers' ``initial_epoch = self._initial_epoch or initial_epoch``
    (Keras's own ``BackupAndRestore`` sets it); tripwire:
    ``tests/integration/keras/test_exact_resume.py::test_a_finished_run_rerun_trains_nothing``.
    """
    model._initial_epoch = epoch
