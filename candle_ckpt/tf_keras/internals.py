"""Every private piece of tf_keras (Keras 2) and TensorFlow that the tf_keras adapter touches.

The Keras 3 gateway is :mod:`candle_ckpt.keras.internals`; no other module
reaches ``tf_keras.src``, ``tensorflow.python`` or a stack frame
(``tests/unit/test_architecture.py`` fails if one does). Each accessor's
docstring ends with one line: what it relies on, and the tripwire test that
fails when a release moves it. docs/api.rst lists the same dependencies.

Its four functions :func:`find_fit`, :func:`wrap_epoch`, :func:`set_first_epoch`
and :func:`stopped_early` are the tf_keras
:class:`~candle_ckpt.engine.fit_port.FitPort` (this module is passed as the port).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from tf_keras.src.saving.legacy import hdf5_format

from candle_ckpt.engine.fit_port import FoundFit

_HOOK_DEPTH = 12  # frames searched above the port's caller (the run) for the hook


def save_weights_to_h5(h5: Any, model: Any) -> None:
    """Write the model's weights into an open h5py file, as ``model.save_weights("x.h5")`` does.

    Relies on: ``tf_keras.src.saving.legacy.hdf5_format.save_weights_to_hdf5_group``
    -- tripwire ``tests/integration/distributed/test_worker_state.py``.
    """
    hdf5_format.save_weights_to_hdf5_group(h5, model)


def save_model_to_h5(h5: Any, model: Any) -> None:
    """Write the full model (without the optimizer) into an open h5py file, as ``model.save("x.h5")`` does.

    Relies on: ``hdf5_format.save_model_to_hdf5(model, h5, include_optimizer)``
    -- tripwire ``tests/integration/distributed/test_worker_state.py``.
    """
    hdf5_format.save_model_to_hdf5(model, h5, include_optimizer=False)


def load_weights_from_h5(h5: Any, model: Any) -> None:
    """Load weights from an open h5py file; every layer is checked before any is assigned.

    Relies on: ``hdf5_format.load_weights_from_hdf5_group(f, model)``
    -- tripwire ``tests/integration/distributed/test_worker_state.py``.
    """
    hdf5_format.load_weights_from_hdf5_group(h5, model)


def build_optimizer_variables(opt: Any, variables: list[Any]) -> None:
    """Create an optimizer's slot variables for ``variables`` (legacy and new tf_keras optimizers).

    Relies on: ``OptimizerV2._create_all_weights`` (legacy) or ``Optimizer._built``
    -- tripwire ``test_resume_order.py::test_tf_keras_restart_before_compile_resumes_bit_identical``.
    """
    if hasattr(opt, "_create_all_weights"):  # tf_keras.optimizers.legacy.*
        opt._create_all_weights(variables)
    elif not getattr(opt, "_built", False):
        opt.build(variables)


def keep_tensor_logs(callback: Any) -> None:
    """Let tf_keras hand the callback its batch logs as tensors (no host sync per step).

    Relies on: ``Callback._supports_tf_logs``
    -- tripwire ``tests/integration/tf_keras/test_tfk_preempt.py``.
    """
    callback._supports_tf_logs = True


def fit_arguments(model: Any) -> dict[str, Any] | None:
    """The locals of the tf_keras ``fit`` of ``model`` running now (``x``, ``shuffle``, ``data_handler``, ...), or None.

    Relies on: ``Model.fit``'s frame (locals ``self``, ``x``, ``shuffle``) within 10 frames of ``on_train_begin``
    -- tripwire ``test_tfk_exactness.py::test_tf_keras_with_shuffle_and_a_generator_dropout_resumes_bit_identical``.
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(10):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model and "shuffle" in frame.f_locals:
            return dict(frame.f_locals)
    return None


def handler_adapter(handler: Any) -> Any:
    """The ``DataAdapter`` of a ``fit``'s ``DataHandler`` (``fit``'s local ``data_handler``), or None.

    Relies on: ``DataHandler._adapter``
    -- tripwire ``test_tfk_exactness.py::test_tf_keras_with_shuffle_and_a_generator_dropout_resumes_bit_identical``.
    """
    return getattr(handler, "_adapter", None)


def fast_forward_input(model: Any, fit_locals: dict[str, Any]) -> bool:
    """Make a resumed ``fit`` on arrays read the batches an uninterrupted ``fit`` from epoch 0 reads from its
    ``initial_epoch`` on; False where its input is not such a pipeline (nothing changed).

    tf_keras shuffles arrays with a stateful ``tf.random.shuffle`` in its own ``tf.data`` pipeline, one
    iterator for all the epochs of a ``fit``: epoch N reads the N-th permutation of a kernel seeded from the
    global seed. The pipeline is built again for every epoch from 0 (in the strategy's scope, as ``fit`` does)
    and the batches of the epochs before the first one ``fit`` runs (its ``initial_epoch``, or where
    :func:`set_first_epoch` makes it start) are skipped; the iterator ``fit`` makes starts after them.

    Relies on: ``fit``'s locals ``data_handler``, ``x``, ``y``, ``sample_weight``, ``batch_size``,
    ``steps_per_epoch``, ``shuffle``, ``class_weight``; ``DataHandler(..., distribute=False)``,
    ``DataHandler._dataset``, ``_epochs``, ``_initial_epoch``, ``_inferred_steps``, ``_steps_per_execution``,
    ``_adapter.should_recreate_iterator()``
    -- tripwire ``test_tfk_exactness.py::test_tf_keras_with_shuffle_and_a_generator_dropout_resumes_bit_identical``.
    """
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter

    handler = fit_locals.get("data_handler")
    start = getattr(model, "_training_state", None)  # set_first_epoch's: fit starts there, not at initial_epoch
    first = start.epoch if isinstance(start, _FirstEpoch) else getattr(handler, "_initial_epoch", 0)
    if handler is None or not first or handler_adapter(handler).should_recreate_iterator():
        return False
    again = data_adapter.DataHandler(
        x=fit_locals["x"],
        y=fit_locals["y"],
        sample_weight=fit_locals["sample_weight"],
        batch_size=fit_locals["batch_size"],
        steps_per_epoch=fit_locals["steps_per_epoch"],
        initial_epoch=0,
        epochs=handler._epochs,
        shuffle=fit_locals["shuffle"],
        class_weight=fit_locals["class_weight"],
        model=model,
        steps_per_execution=handler._steps_per_execution,
        distribute=False,
    )
    dataset = again._dataset.skip(first * again._inferred_steps)
    if not isinstance(handler._dataset, tf.data.Dataset):  # fit distributes its input: so does this one
        dataset = tf.distribute.get_strategy().experimental_distribute_dataset(dataset)
    handler._dataset = dataset
    return True


def random_generators(model: Any) -> list[tuple[str, str, Any]]:
    """``(layer name, rng type, tf.random.Generator or None)`` of every layer of ``model`` that draws random numbers.

    The rng type is tf_keras's: ``"stateful"`` (a ``tf.random.Generator``, under
    ``tf_keras.backend.experimental.enable_tf_random_generator()``), ``"stateless"`` or ``"legacy_stateful"``
    (TF1 stateful kernels, the default; no generator).

    Relies on: ``BaseRandomLayer._random_generator`` (``backend.RandomGenerator``: ``_rng_type``,
    ``_maybe_init()``, ``_generator``)
    -- tripwire ``test_tfk_exactness.py::test_tf_keras_with_shuffle_and_a_generator_dropout_resumes_bit_identical``.
    """
    found = []
    for layer in model.submodules:
        rng = getattr(layer, "_random_generator", None)
        if rng is None or not hasattr(rng, "_rng_type"):
            continue
        found.append((layer.name, rng._rng_type, getattr(rng, "_generator", None)))
    return found


def random_layers(model: Any) -> list[str]:
    """The class names of the model's layers that draw from TF1 stateful kernels (``Dropout``, ... by default).

    Relies on: ``BaseRandomLayer._random_generator._rng_type``
    -- tripwire ``test_worker_state.py::test_tf_keras_fit_says_once_why_its_resume_is_not_exact``.
    """
    legacy = []
    for layer in model.submodules:
        rng = getattr(layer, "_random_generator", None)
        if rng is not None and getattr(rng, "_rng_type", "legacy_stateful") == "legacy_stateful":
            legacy.append(type(layer).__name__)
    return sorted(set(legacy))


def find_fit(callback: Any) -> FoundFit | None:
    """The tf_keras ``fit`` calling ``callback``'s hook now: its ``CallbackList`` (the hook's caller; None if not)
    and a probe of whether the frame that called the list (``fit``'s) is still on a thread's stack. None: no hook
    of ``callback`` runs on this thread.

    Relies on: ``CallbackList.on_train_begin`` calling each callback's (its frame's local ``self``), called by
    ``Model.fit``; ``sys._getframe`` (CPython)
    -- tripwire ``test_worker_state.py::test_a_tf_keras_fit_that_raises_in_another_callback_releases_the_lock``.
    """
    import tf_keras

    frame: FrameType | None = sys._getframe(1)
    for _ in range(_HOOK_DEPTH):  # up to the callback's hook
        if frame is None or frame.f_locals.get("self") is callback:
            break
        frame = frame.f_back
    else:
        frame = None
    while frame is not None and frame.f_back is not None and frame.f_back.f_locals.get("self") is callback:
        frame = frame.f_back  # the outermost: a subclass's hook calls ours through super()
    caller = frame.f_back if frame is not None else None
    if caller is None:
        return None
    listed = caller.f_locals.get("self")
    if not isinstance(listed, tf_keras.callbacks.CallbackList):
        return FoundFit(None, _probe(caller))
    return FoundFit(listed, _probe(caller.f_back)) if caller.f_back is not None else None


def _probe(frame: FrameType) -> Callable[[], bool]:
    """Whether ``frame`` is on the calling thread's stack (it keeps the frame's id and code, not the frame)."""
    frame_id, code = id(frame), frame.f_code
    return lambda: any(id(f) == frame_id and f.f_code is code for f, _ in traceback.walk_stack(None))


def wrap_epoch(callback_list: Any, hooks: Mapping[str, Callable[..., None]]) -> None:
    """Make ``fit`` call ``hooks[name]`` where it calls the list's ``name`` (``on_epoch_end``).

    Relies on: ``Model.fit`` calling ``callbacks.on_epoch_end(epoch, logs)`` on the list (an instance attribute
    wins over the method) -- tripwire ``test_tfk_exactness.py::test_a_finished_tf_keras_run_rerun_trains_nothing``.
    """
    for name, hook in hooks.items():
        setattr(callback_list, name, hook)


def stopped_early(callback: Any, epoch: int) -> bool:
    """Whether ``callback`` is an ``EarlyStopping`` that ended training at tf_keras's epoch index ``epoch``.

    Relies on: ``tf_keras.callbacks.EarlyStopping.stopped_epoch``
    -- tripwire ``test_tfk_exactness.py::test_a_finished_tf_keras_run_rerun_trains_nothing``.
    """
    import tf_keras

    return isinstance(callback, tf_keras.callbacks.EarlyStopping) and callback.stopped_epoch == epoch


class _FirstEpoch:
    """Stands in for tf_keras's fault-tolerance state: ``fit`` starts at ``epoch`` whatever its ``initial_epoch``."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: Any, initial_epoch: int, mode: Any) -> tuple:
        return self.epoch, 0


def set_first_epoch(model: Any, epoch: int | None) -> bool:
    """Make the tf_keras ``fit`` that is starting begin at ``epoch`` (None: undo); False if another owner
    (``BackupAndRestore``) holds the seam.

    Relies on: ``Model._training_state`` and ``fit`` asking its
    ``maybe_load_initial_counters_from_ckpt(steps, initial_epoch, mode)`` after ``on_train_begin``
    -- tripwire ``test_tfk_exactness.py::test_a_finished_tf_keras_run_rerun_trains_nothing``.
    """
    current = getattr(model, "_training_state", None)
    if epoch is None:
        if isinstance(current, _FirstEpoch):
            model._training_state = None
        return True
    if current is not None and not isinstance(current, _FirstEpoch):
        return False
    model._training_state = _FirstEpoch(epoch)
    return True
