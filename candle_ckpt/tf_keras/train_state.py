"""``train.state.npz`` for tf_keras: global RNGs, other callbacks, a ``Sequence``'s attributes, the learning rate.

The tf_keras counterpart of :mod:`candle_ckpt.keras.train_state`, with the
same framework-free parts (:mod:`candle_ckpt.engine.state_file`,
:mod:`candle_ckpt.engine.dataset_attrs`). Each epoch checkpoint holds:

* ``rng``: Python's ``random`` (tf_keras shuffles a ``Sequence``'s batch
  order with it), NumPy's global state (``np.random.shuffle`` in
  ``on_epoch_end``) and TensorFlow's global ``tf.random.Generator`` once one
  exists;
* ``callbacks``: ``EarlyStopping``'s and ``ReduceLROnPlateau``'s counters
  and best values, ``ModelCheckpoint``'s best, ``CSVLogger``'s file size,
  and the ``get_state()`` of any callback that has one (the Keras 3 rule);
* ``sequence``: the small attributes of a ``tf_keras.utils.Sequence`` input
  (its index, counters);
* ``lr``: the optimizer's learning rate when it is a variable
  (``ReduceLROnPlateau`` sets it; it is not among the optimizer's variables).

tf_keras calls a ``Sequence``'s ``on_epoch_end`` after every callback's
``on_epoch_end``, so after the save: a resumed ``fit`` puts the attributes
and RNGs of the save back and then makes that call, as the uninterrupted run
did, before its first epoch. The callbacks get their state back at the
resumed ``fit``'s first ``on_epoch_begin``, after their own
``on_train_begin`` has reset them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from candle_ckpt.core.log import SaidOnce
from candle_ckpt.distributed.tf_internals import tf_global_generator
from candle_ckpt.engine import dataset_attrs
from candle_ckpt.engine.state_file import (
    TRAIN_STATE_FILE,
    CallbackRule,
    capture_generator,
    capture_rng,
    pack,
    restore_generator,
    restore_rng,
    unpack,
)

__all__ = ["TRAIN_STATE_FILE", "TfTrainState"]

RULE = CallbackRule(tf_keras.callbacks)


def _sequence(fit_args: dict[str, Any] | None) -> Any:
    """The ``tf_keras.utils.Sequence`` that ``fit`` reads, else None."""
    x = (fit_args or {}).get("x")
    return x if isinstance(x, tf_keras.utils.Sequence) else None


def _lr_variable(model: Any) -> Any:
    """The optimizer's learning rate if it is a variable (not a schedule), else None."""
    lr = getattr(getattr(model, "optimizer", None), "learning_rate", None)
    return lr if isinstance(lr, tf.Variable) else None


class TfTrainState:
    """Capture and restore the training state of one tf_keras ``fit`` (see the module docstring).

    Args:
        warn: Logs a warning; each message is logged once.
    """

    def __init__(self, warn: Callable[[str], None]) -> None:
        self.warn_once = SaidOnce(warn)
        self.callbacks: list[Any] = []
        self.sequence: Any = None
        self._changed: set[str] = set()  # what the Sequence's on_epoch_end changed (dataset_attrs.watch)
        self._unwatch: Callable[[], None] | None = None
        self._checked = False

    def bind(self, callbacks: list[Any], fit_args: dict[str, Any] | None) -> None:
        """At ``on_train_begin``: this ``fit``'s other callbacks and its ``Sequence`` input (watched)."""
        self.unbind()
        self.callbacks, self.sequence, self._checked = callbacks, _sequence(fit_args), False
        seq = self.sequence
        if seq is None or type(seq).on_epoch_end is tf_keras.utils.Sequence.on_epoch_end:
            return
        original = seq.on_epoch_end

        def on_epoch_end() -> None:
            dataset_attrs.watch(seq, original, self._changed, self.warn_once, set())

        seq.on_epoch_end = on_epoch_end

        def unwatch() -> None:
            if seq.__dict__.get("on_epoch_end") is on_epoch_end:
                del seq.on_epoch_end

        self._unwatch = unwatch

    def unbind(self) -> None:
        """At the end of ``fit``: the ``Sequence``'s own ``on_epoch_end`` again."""
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def capture(self, model: Any) -> bytes:
        """The packed state now (on the training thread: the bytes own their data)."""
        if not self._checked:
            self._checked = True
            for message in RULE.unsaved_messages(self.callbacks):
                self.warn_once(message)
        doc: dict[str, Any] = {}
        doc["rng"], arrays = capture_rng()
        capture_generator(tf_global_generator(), doc["rng"], arrays)
        doc["callbacks"], more = RULE.capture(self.callbacks)
        arrays.update(more)
        if self.sequence is not None:
            doc["sequence"], more = dataset_attrs.capture(self.sequence, self._changed, set())
            arrays.update(more)
        lr = _lr_variable(model)
        if lr is not None:
            arrays["lr"] = np.array(lr.numpy(), copy=True)
        return pack(doc, arrays)

    def restore_input(self, data: bytes, model: Any, epoch_end: bool) -> list[str]:
        """Before the first epoch (``on_train_begin``): the learning rate and, after an epoch checkpoint
        (``epoch_end``), the ``Sequence`` and the RNGs of the save, then the ``Sequence``'s ``on_epoch_end``
        that followed the save; return what was restored."""
        doc, arrays = unpack(data)
        done = []
        lr = _lr_variable(model)
        if lr is not None and "lr" in arrays:
            lr.assign(arrays["lr"])
            done.append("learning rate")
        if not epoch_end:
            return done
        seq = self.sequence
        if seq is not None and "sequence" in doc:
            done += [f"{type(seq).__name__}.{n}" for n in dataset_attrs.restore(seq, doc["sequence"], arrays)]
        done += [f"rng:{name}" for name in restore_rng(doc["rng"], arrays)]
        done += [f"rng:{name}" for name in restore_generator(tf.random.get_global_generator, doc["rng"], arrays)]
        if seq is not None:
            seq.on_epoch_end()
            done.append(f"{type(seq).__name__}.on_epoch_end() replayed")
        return done

    def restore_callbacks(self, data: bytes) -> list[str]:
        """At the first ``on_epoch_begin`` (every ``on_train_begin`` has run): the other callbacks' state."""
        doc, arrays = unpack(data)
        return RULE.restore(self.callbacks, doc.get("callbacks", {}), arrays, self.warn_once)
