"""TensorFlow's private pieces outside the Keras gateways: what both Keras adapters need, and the coordination
service and worker numbering of a ``tf.distribute`` job (:mod:`candle_ckpt.distributed.tf_group`).

Neither adapter imports the other, and each has its own gateway (:mod:`candle_ckpt.keras.internals`,
:mod:`candle_ckpt.tf_keras.internals`); what both read of TensorFlow itself is reached here, once, and so is
what distributed/ reads (it may import neither adapter). No other module imports ``tensorflow.python``
(tests/unit/test_architecture.py). TensorFlow is imported lazily: this module loads without it. As in the
gateways, each accessor's docstring ends with what it relies on and its tripwire tests.
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


def coordination_context() -> Any:
    """TensorFlow's eager context: its ``*_config_key_value`` calls reach the coordination service.

    The gateway to TensorFlow's coordination service, as ``jax_group.coordination_client`` is to JAX's
    (TensorFlow has no public handle on it; its own ``PreemptionCheckpointHandler`` uses this one).

    Relies on: ``tensorflow.python.eager.context.context()`` (``set_config_key_value``,
    ``get_config_key_value``, ``delete_config_key_value``)
    -- tripwire ``test_tf_group.py::test_tf_group_meets_over_tensorflows_coordination_service``.
    """
    from tensorflow.python.eager import context  # noqa: PLC0415

    return context.context()


def worker_rank(cluster_spec: dict[str, Any], task_type: str, task_id: int) -> int:
    """A worker's rank in its cluster (the chief is 0), as TensorFlow's ``PreemptionCheckpointHandler`` numbers it.

    Relies on: ``tensorflow.python.distribute.multi_worker_util.id_in_cluster``
    -- tripwire ``test_tf_group.py::test_tf_group_meets_over_tensorflows_coordination_service``.
    """
    from tensorflow.python.distribute import multi_worker_util  # noqa: PLC0415

    return multi_worker_util.id_in_cluster(cluster_spec, task_type, task_id)
