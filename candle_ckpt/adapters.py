"""Which adapter serves a model: Keras 3 or tf_keras (Keras 2).

The one place that knows both adapters. The layers below it (``distributed``,
``engine``) take an adapter and import none; the adapter modules are imported
here lazily, so asking "is this a tf_keras model?" imports neither Keras.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.distributed import worker_state


def is_tf_keras(model: Any) -> bool:
    """True for a tf_keras (Keras 2) model, False for a Keras 3 one."""
    return any(cls.__module__.split(".")[0] == "tf_keras" for cls in type(model).__mro__)


def default_adapter(model: Any) -> Any:
    """The capture/restore adapter for ``model``: tf_keras (Keras 2) or Keras 3."""
    if is_tf_keras(model):
        from candle_ckpt.tf_keras.adapter import TfKerasModelAdapter

        return TfKerasModelAdapter(model)
    from candle_ckpt.keras.adapter import KerasModelAdapter

    return KerasModelAdapter(model)


class WorkerTrainingState(worker_state.WorkerTrainingState):
    """:class:`candle_ckpt.distributed.worker_state.WorkerTrainingState` that picks the
    adapter for ``model`` when none is given (the public ``candle_ckpt.WorkerTrainingState``)."""

    def __init__(self, gParameters: Any, model: Any = None, strategy: Any = None, *, adapter: Any = None, **kw: Any):
        if adapter is None:
            if model is None:
                raise TypeError("WorkerTrainingState needs a model or an adapter")
            adapter = default_adapter(model)
        super().__init__(gParameters, model, strategy, adapter=adapter, **kw)
