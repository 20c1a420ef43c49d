"""Every private piece of Keras 3 that candle_ckpt touches, and nothing else.

No other module reaches ``keras.src``, ``tensorflow.python`` or a stack frame (``tests/unit/test_architecture.py``
fails if one does) but its sibling :mod:`candle_ckpt.keras.fit_internals`, which holds the running ``fit`` (its
frames, its epoch iterator and data adapter: the Keras 3 port of :mod:`candle_ckpt.engine.fit_port`); the tf_keras
adapter has its own gateway, :mod:`candle_ckpt.tf_keras.internals`. TensorFlow pieces that the Keras 3 path needs
(its RNG states, its end-of-input error) live here too: saving, models, optimizers, random number generators.

Each accessor's docstring ends with one line: what it relies on, and the tripwire test that fails when a Keras
release moves it. The tripwires run on every Keras version we support (``.ci/run``: the oldest, the installed one
and keras-nightly); where a piece moved, the accessor holds both. docs/api.rst lists the same dependencies.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import keras
from keras.src.saving import saving_lib
from keras.src.utils import module_utils

KERAS_VERSION: str = keras.__version__

# The Keras releases CI runs the suite on (see .ci/run); setup.cfg's range is the same.
SUPPORTED = ((3, 13), (3, 16))

# Saving formats that changed: (first release of the new format, what changed). A file written
# by an older Keras and read by one at or past the change may be read wrongly.
_CONTAINERS = "Keras 3.15 stores layers held in lists or dicts inside a layer under 'container*' groups; "
FORMAT_CHANGES = (((3, 15), _CONTAINERS + "a file written before it has them elsewhere, and Keras skips them"),)


def unsupported(version: str = KERAS_VERSION) -> str | None:
    """A warning for a Keras release outside :data:`SUPPORTED` (None inside it).

    Relies on: nothing private; the range CI runs
    -- tripwire ``tests/integration/keras/test_keras_versions.py::test_a_keras_outside_the_range_is_named``.
    """
    release = _release(version)
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    if release is None or SUPPORTED[0] <= release <= SUPPORTED[1]:
        return None
    return (
        f"candle_ckpt is tested with Keras {lo_major}.{lo_minor} to {hi_major}.{hi_minor}, and this is Keras "
        f"{version}: checkpoints may fail to save or restore; install a Keras in that range "
        f"(pip install 'keras>={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}')"
    )


# -- saving_lib ---------------------------------------------------------------------------

H5IOStore = saving_lib.H5IOStore
"""Keras's weights store; our plan and read stores subclass it.
Relies on: ``saving_lib.H5IOStore(path_or_io, mode)``, ``make``, ``__setitem__``, ``close`` -- tripwire
``tests/integration/keras/test_keras_format.py::test_saving_lib_still_has_what_we_call``."""


def save_state(obj: Any, store: Any, skip: set[int]) -> None:
    """Walk ``obj`` as ``save_weights`` does, handing every variable to ``store``.

    Relies on: ``saving_lib._save_state(saveable, weights_store, assets_store, inner_path, visited_saveables)``
    -- tripwire ``test_keras_format.py::test_saving_lib_still_has_what_we_call``.
    """
    saving_lib._save_state(obj, weights_store=store, assets_store=None, inner_path="", visited_saveables=skip)


def load_state(obj: Any, store: Any, skip: set[int]) -> None:
    """Load ``obj`` from ``store`` as ``load_weights`` does; raise on the first object that cannot be loaded.

    Keras's own "Skipping variable loading" and "Skipping nested container"
    warnings (a file that does not hold what the model has) are raised as
    :class:`ValueError` instead of passing silently.

    Relies on: ``saving_lib._load_state(..., failed_saveables, error_msgs)`` and ``_raise_loading_failure``
    -- tripwire ``test_keras_format.py::test_saving_lib_still_has_what_we_call``.
    """
    failed: set[int] = set()
    errors: dict[int, Any] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Skipping variable loading")
        warnings.filterwarnings("error", message="Skipping nested container")
        try:
            saving_lib._load_state(
                obj,
                weights_store=store,
                assets_store=None,
                inner_path="",
                visited_saveables=skip,
                failed_saveables=failed,
                error_msgs=errors,
            )
        except UserWarning as warning:
            raise ValueError(f"the weights file does not hold what the model has: {warning}") from None
    if failed:
        saving_lib._raise_loading_failure(errors)


def serialize_model_as_json(model: Any) -> tuple[str, str]:
    """Return (config.json, metadata.json) of the model's ``.keras`` archive, without importing TensorFlow.

    Keras's serializer asks ``tf.available`` of each value, which imports TensorFlow (seconds, and its start-up
    lines mid-training, at the first save of a JAX or torch job with TensorFlow installed). While TensorFlow is not
    imported no object of its can exist, so "unavailable" is exact: it is given for the call, then asked again.

    Relies on: ``saving_lib._serialize_model_as_json(model)`` and ``module_utils.tensorflow._available`` (None
    until asked) -- tripwire ``test_keras_format.py::test_saving_lib_still_has_what_we_call``.
    """
    lazy = module_utils.tensorflow
    if "tensorflow" in sys.modules or getattr(lazy, "_available", False) is not None:
        return saving_lib._serialize_model_as_json(model)
    lazy._available = False
    try:
        return saving_lib._serialize_model_as_json(model)
    finally:
        if "tensorflow" not in sys.modules:
            lazy._available = None  # not asked for real: the next question imports it, as before


def h5_dataset(store: Any, key: str) -> Any:
    """The h5py dataset ``key`` of the store's current group, after Keras's safety checks.

    Relies on: ``saving_lib.safe_get_h5_dataset(group, name)`` (Keras 3.14 on) or
    ``H5IOStore._verify_dataset`` (3.13), and ``H5IOStore._h5_entry_group``
    -- tripwire ``test_keras_format.py::test_saving_lib_still_has_what_we_call``.
    """
    group = store._h5_entry_group
    safe_get = getattr(saving_lib, "safe_get_h5_dataset", None)
    if safe_get is not None:
        return safe_get(group, key)
    # Keras 3.13 follows links and external storage; refuse them as 3.14 does (same messages).
    import h5py

    if key not in group:
        raise KeyError(key)
    link = group.get(key, default=None, getclass=True, getlink=True)
    if link in (h5py.ExternalLink, h5py.SoftLink):
        raise ValueError(f"Not allowed: H5 file with {link.__name__}")
    dataset = store._verify_dataset(group[key])
    if dataset.external:
        raise ValueError(f"Not allowed: H5 file with external Dataset: {dataset.external}")
    if dataset.is_virtual:
        raise ValueError("Not allowed: H5 file with virtual Dataset")
    return dataset


def stock_save_own_variables() -> Callable[..., Any]:
    """``BaseOptimizer.save_own_variables``, to tell an optimizer that keeps the stock one.

    Relies on: ``keras.src.optimizers.base_optimizer.BaseOptimizer``
    -- tripwire ``test_keras_format.py::test_plan_copies_no_optimizer_state``.
    """
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return BaseOptimizer.save_own_variables


def format_change(saved_version: str | None) -> str | None:
    """What changed in the saving format between the Keras that wrote a file and this one, or None.

    Relies on: :data:`FORMAT_CHANGES` (read from Keras's release notes)
    -- tripwire ``tests/integration/keras/test_keras_versions.py::test_format_change_names_the_container_groups``.
    """
    saved, running = _release(saved_version), _release(KERAS_VERSION)
    if saved is None or running is None:
        return None
    changed = [what for since, what in FORMAT_CHANGES if saved < since <= running]
    return "; ".join(changed) or None


def _release(version: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a Keras version string (``"3.14.1"``, ``"3.16.0.dev2026"``); None if it is not one."""
    parts = (version or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


# -- models and optimizers ------------------------------------------------------------------


def callback_model(callback: Any) -> Any:
    """The model ``set_model`` gave a Keras callback, or None before it.

    Not the ``model`` property, which on JAX first copies the training state into the model's variables
    (``jax_state_sync``) and on torch unwraps a ``DistributedDataParallel``.

    Relies on: ``keras.callbacks.Callback._model`` (None from ``__init__``, set by ``set_model``)
    -- tripwire ``test_candle_api.py::test_the_gateway_reads_the_model_set_model_gave_a_callback``.
    """
    return getattr(callback, "_model", None)


def flatten_layers(model: Any) -> list[Any]:
    """Every layer inside ``model``, nested ones included, the model itself left out.

    Relies on: ``Layer._flatten_layers(include_self=False)``
    -- tripwire ``tests/integration/keras/test_partial_load.py``.
    """
    return list(model._flatten_layers(include_self=False))


def optimizer_strategy(opt: Any) -> Any:
    """The ``tf.distribute`` strategy an optimizer was made under (None outside one).

    Relies on: ``Optimizer._distribution_strategy`` (TensorFlow backend)
    -- tripwire ``test_distributed.py::test_mirrored_fit_killed_mid_epoch_resumes_bit_identical``.
    """
    return getattr(opt, "_distribution_strategy", None)


def sync_jax_state(model: Any) -> None:
    """JAX keeps the training state outside the variables between epoch ends: put it back.

    Relies on: ``JAXTrainer.state_sync`` (Keras 3.16 on) or ``jax_state_sync`` (before)
    -- tripwire ``tests/integration/keras/test_mid_epoch.py::test_restart_from_a_step_checkpoint_in_process_is_exact``.
    """
    sync = getattr(model, "state_sync", None) or getattr(model, "jax_state_sync", None)
    if callable(sync):
        sync()


# -- random number generators ---------------------------------------------------------------


def keras_global_seed_generator(create: bool) -> Any:
    """Keras's global ``SeedGenerator``; with ``create=False`` None if it does not exist yet.

    Relies on: ``keras.src.random.seed_generator.global_seed_generator`` / ``GLOBAL_SEED_GENERATOR``
    -- tripwire ``tests/integration/keras/test_resume_order.py::test_every_global_rng_state_round_trips``.
    """
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    if create:
        return seed_generator.global_seed_generator()
    return global_state.get_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR)


def tf_op_seed_rng() -> Any:
    """The ``random.Random`` TensorFlow's eager context draws op seeds from (None before ``set_seed``).

    Relies on: ``tensorflow.python.eager.context.context()._rng``
    -- tripwire ``test_resume_order.py::test_every_global_rng_state_round_trips``.
    """
    from tensorflow.python.eager import context

    return getattr(context.context(), "_rng", None)


def tf_out_of_range() -> type[BaseException]:
    """TensorFlow's end-of-input error when TensorFlow is loaded, else StopIteration.

    Relies on: ``tensorflow.python.framework.errors_impl.OutOfRangeError``
    -- tripwire ``tests/integration/keras/test_mid_epoch.py::test_skip_steps_takes_the_first_steps_of_one_epoch_only``.
    """
    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    return getattr(tf_errors, "OutOfRangeError", StopIteration)


_SKIPSET_TYPES = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss")


def warm_skipsets() -> None:
    """Compute Keras's per-type attribute skip sets once, outside any ``keras.distribution``, and cache them.

    ``saving_lib._save_state`` (the save plan's walk) builds each skip set from a
    reference object: for optimizers ``Optimizer(1.0)``, which creates Keras
    variables. Under a distribution spanning several processes creating a
    variable is a cross-process collective, so a walk on only some processes (a
    save, a restore) would fail or hang. Keras means to cache the sets, but
    (3.15) reads ``saving_attr_skiplist_<type>`` and writes
    ``saving_attr_skipset_<type>``, so every walk builds them again. Here they
    are built with no distribution set (plain local values) and stored under
    the key Keras reads: later walks create nothing.

    Relies on: ``saving_lib.get_attr_skipset`` and the global attribute ``saving_attr_skiplist_<type>``
    -- tripwire ``test_warm_skipsets.py::test_skipsets_are_cached_and_the_distribution_is_put_back``.
    """
    from keras.src.backend.common import global_state  # noqa: PLC0415

    missing = [t for t in _SKIPSET_TYPES if global_state.get_global_attribute(_skip_key(t), None) is None]
    if not missing:
        return
    current = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        for obj_type in missing:
            global_state.set_global_attribute(_skip_key(obj_type), saving_lib.get_attr_skipset(obj_type))
    finally:
        keras.distribution.set_distribution(current)


def _skip_key(obj_type: str) -> str:
    return f"saving_attr_skiplist_{obj_type}"


if unsupported() is not None:  # said once, when the Keras adapter is first imported
    warnings.warn(unsupported(), stacklevel=2)
