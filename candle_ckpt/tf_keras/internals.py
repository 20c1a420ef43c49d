"""Every private piece of tf_keras (Keras 2) and TensorFlow that the tf_keras adapter touches.

The Keras 3 gateway is :mod:`candle_ckpt.keras.internals`; no other module
reaches ``tf_keras.src``, ``tensorflow.python`` or a stack frame
(``tests/unit/test_architecture.py`` fails if one does). Each accessor's
docstring ends with one line: what it relies on, and the tripwire test that
fails when a release moves it. docs/api.rst lists the same dependencies.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from tf_keras.src.saving.legacy import hdf5_format

# The file names of tf_keras's callback dispatcher (its CallbackList), whose frames are not the fit's.
CALLBACK_DISPATCH_FILES = ("callbacks.py",)


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
    -- tripwire ``tests/integration/distributed/test_tfk_preempt.py``.
    """
    callback._supports_tf_logs = True


def hook_frame() -> FrameType:
    """The frame of the calling function (a callback hook, for :class:`~candle_ckpt.engine.fit_guard.FitGuard`).

    Relies on: ``sys._getframe`` (CPython) and ``CALLBACK_DISPATCH_FILES``
    -- tripwire ``test_worker_state.py::test_a_tf_keras_fit_that_raises_in_another_callback_releases_the_lock``.
    """
    return sys._getframe(1)
