"""The one-process Keras 3 adapter (``adapter``): capture and restore of a model, the fit callback,
``restart()`` and partial loads; Keras's private parts through ``internals`` only. Several JAX processes: the
same callback and ``restart()`` over :mod:`candle_ckpt.multihost`. ``JobRunner``: :mod:`candle_ckpt.runner`.
"""
