"""Where a callback meets the rest of ``model.fit``: its sibling callbacks and the input.

Keras gives a callback its model, not the ``CallbackList`` it sits in nor
the epoch iterator that feeds the model. Both are found here, once, when
``fit`` calls ``on_train_begin``: the ``CallbackList`` is the ``self`` of
the calling frame, and Keras 3's TensorFlow ``fit`` keeps the iterator in
its local ``epoch_iterator``. These are Keras internals, reached through
:mod:`candle_ckpt.keras.internals` (which names the tripwire test of each). When they cannot be found the
callback falls back to saving in its own ``on_epoch_end`` and says what that
costs (see :mod:`candle_ckpt.keras.callback`).

A resumed ``fit`` that starts in the middle of an epoch (a step checkpoint)
has the epoch iterator's ``_enumerate_iterator`` wrapped for that one epoch
(:func:`skip_steps`): the steps already done are taken from it as ``fit``
would have taken them (their batches drawn, so the input and its RNGs move
exactly as in the uninterrupted run), and the step numbers, the steps seen
and everything after continue unchanged.

The ``CallbackList`` gets two instance attributes that wrap its
``on_epoch_begin`` and ``on_epoch_end`` (the list's order and every other
callback are untouched): the checkpoint of epoch N is taken after *every*
callback's ``on_epoch_end`` for epoch N, whatever the order of the list,
and the saved state of a resumed run is put back after every callback's
``on_train_begin`` and before the first ``on_epoch_begin``. The wrappers
hold the list only weakly: a wrapper stored on the list that held it would
make a cycle, and the list would outlive ``fit`` until a full garbage
collection (its death is how :mod:`candle_ckpt.engine.fit_guard` learns that a
``fit`` raised).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from candle_ckpt.engine.fit_guard import weakly_bound
from candle_ckpt.keras import internals

_MARK = "_candle_ckpt_hooked"

# Found in the frames of the running fit, by the gateway (re-exported here for the callback).
find_callback_list = internals.find_callback_list
find_epoch_iterator = internals.find_epoch_iterator


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
    begin, end = weakly_bound(callback_list, "on_epoch_begin"), weakly_bound(callback_list, "on_epoch_end")

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
    ref = weakref.ref(callback_list)
    end = weakly_bound(callback_list, "on_train_end")

    def on_train_end(logs: Any = None) -> None:
        del ref().on_train_end
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
    per = max(int(getattr(epoch_iterator, "steps_per_execution", 1) or 1), 1)

    def enumerate_skipping(steps_gen: Any) -> Any:
        start, done = time.perf_counter(), 0
        seen = internals.steps_seen(epoch_iterator)
        try:
            while done < steps:
                _, end, iterator = next(steps_gen)
                if consume:
                    for _ in range(per):
                        next(iterator)
                done = end + 1
        except (StopIteration, internals.tf_out_of_range()):  # fewer steps than saved: the epoch ends here
            then(done, time.perf_counter() - start)
            return
        if not consume:
            internals.set_steps_seen(epoch_iterator, seen)
        then(done, time.perf_counter() - start)
        yield from steps_gen

    internals.replace_steps_once(epoch_iterator, enumerate_skipping)
