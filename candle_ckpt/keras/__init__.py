"""The Keras 3 adapter (``adapter``): capture and restore of a model, the fit
callback, ``restart()``, ``JobRunner`` and partial loads. Keras's private parts
are reached through ``internals`` only.
"""
