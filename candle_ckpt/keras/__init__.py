"""The Keras 3 adapter: the only package that knows Keras internals (state), the fit
callback, ``restart()``, ``JobRunner`` and partial loads.
"""
