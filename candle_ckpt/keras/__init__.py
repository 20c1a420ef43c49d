"""The one-process Keras 3 adapter (``adapter``): capture and restore of a model, the fit callback,
``restart()`` and partial loads. Keras's private parts are reached through ``internals`` only. A JAX job of
several processes is the same callback and ``restart()`` over :mod:`candle_ckpt.multihost`; ``JobRunner`` is
:mod:`candle_ckpt.runner`.
"""
