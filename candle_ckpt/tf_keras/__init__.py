"""The same callback as :mod:`candle_ckpt.keras` for tf_keras (Keras 2) models.

``candle_ckpt.restart()`` serves both kinds of model; it routes a tf_keras model
through :class:`~candle_ckpt.adapters.WorkerTrainingState` with this package's adapter.
"""

from candle_ckpt.tf_keras.adapter import CandleCheckpointCallback, TfKerasModelAdapter

__all__ = ["CandleCheckpointCallback", "TfKerasModelAdapter"]
