"""Where a callback meets the rest of ``model.fit``: its sibling callbacks and the input.

Keras gives a callback its model, not the ``CallbackList`` it sits in nor the epoch iterator. Both are found
once, at ``on_train_begin``, through :mod:`candle_ckpt.keras.fit_internals` (which names each tripwire); when
they cannot be, the callback saves in its own ``on_epoch_end`` and says what that costs.

A fit resumed mid-epoch has the epoch iterator's ``_enumerate_iterator`` wrapped for that one epoch
(:func:`skip_steps`): the done steps are taken as ``fit`` would take them (batches drawn, so the input and its
RNGs move as in the uninterrupted run). The epoch order is the run's (:mod:`candle_ckpt.engine.fit_port`); here
only Keras 3's own: a fit that runs no epoch puts the state back before ``on_train_end``
(:func:`before_train_end`), and the skipped steps.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from candle_ckpt.engine.fit_port import weakly_bound
from candle_ckpt.keras import fit_internals, internals

# Found in the frames of the running fit, by the gateway (re-exported here for the callback).
find_callback_list = fit_internals.find_callback_list
find_epoch_iterator = fit_internals.find_epoch_iterator


def before_train_end(callback_list: Any, then: Callable[[], None]) -> None:
    """Run ``then()`` before every callback's ``on_train_end`` of this fit (a fit that runs no epoch)."""
    ref = weakref.ref(callback_list)
    end = weakly_bound(callback_list, "on_train_end")

    def on_train_end(logs: Any = None) -> None:
        del ref().on_train_end
        then()
        end(logs)

    callback_list.on_train_end = on_train_end


def steps_per_call(epoch_iterator: Any) -> int:
    """Keras's ``steps_per_execution`` of ``fit``'s epoch iterator (1 where it has none): a skip is a multiple."""
    return max(int(getattr(epoch_iterator, "steps_per_execution", 1) or 1), 1)


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
    per = steps_per_call(epoch_iterator)

    def enumerate_skipping(steps_gen: Any) -> Any:
        start, done = time.perf_counter(), 0
        seen = fit_internals.steps_seen(epoch_iterator)
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
            fit_internals.set_steps_seen(epoch_iterator, seen)
        then(done, time.perf_counter() - start)
        yield from steps_gen

    fit_internals.replace_steps_once(epoch_iterator, enumerate_skipping)
