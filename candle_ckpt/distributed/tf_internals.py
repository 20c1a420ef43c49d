"""TensorFlow's private pieces that both Keras adapters need (the Keras 3 one and the tf_keras one).

Neither adapter imports the other, and each has its own gateway (:mod:`candle_ckpt.keras.internals`,
:mod:`candle_ckpt.tf_keras.internals`); what both read of TensorFlow itself is reached here, once.
TensorFlow is imported lazily: this module loads without it. As in the gateways, each accessor's
docstring ends with what it relies on and its tripwire tests.
"""

from __future__ import annotations

from typing import Any


def tf_global_generator() -> Any:
    """TensorFlow's global ``tf.random.Generator`` if one exists (the public getter would create it).

    Relies on: ``tensorflow.python.ops.stateful_random_ops.global_generator``
    -- tripwire ``test_resume_order.py::test_every_global_rng_state_round_trips`` (Keras 3) and
    ``test_tfk_exactness.py::test_tf_keras_global_rngs_and_callback_state_resume_bit_identical`` (tf_keras).
    """
    from tensorflow.python.ops import stateful_random_ops  # noqa: PLC0415

    return getattr(stateful_random_ops, "global_generator", None)
