"""JAX's persistent compilation cache in the fast tier (``ckpt_compile_cache``): a restart loads what it compiled.

``auto`` (the default) puts it in ``<ckpts>/compile-cache`` (:attr:`~candle_ckpt.core.layout.Layout.compile_cache`),
beside the checkpoints and never read as one; ``off`` leaves JAX alone; any other value is the directory. A
directory the job already gave JAX is kept (JAX builds its cache once per process), and so is
``jax_enable_compilation_cache=False``. JAX's 1-s threshold goes to 0 unless the job set its own: on a restart
every compile counts. Only the JAX backend has it. docs/performance.rst ("Restarts: start-up") has the trade.
"""

from __future__ import annotations

import logging
import os

import keras

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.layout import Layout

__all__ = ["cache_dir", "use_compile_cache"]

_LOG = logging.getLogger("candle_ckpt.compile_cache")

#: JAX's own default of ``jax_persistent_cache_min_compile_time_secs``: a value other than this one is the job's.
JAX_DEFAULT_MIN_COMPILE_SECS = 1.0


def cache_dir(cfg: CkptConfig) -> str | None:
    """The directory ``cfg``'s ``ckpt_compile_cache`` names (absolute), or None when it is ``off``."""
    if cfg.compile_cache == "off":
        return None
    if cfg.compile_cache == "auto":
        return Layout.of(cfg).compile_cache
    return os.path.abspath(os.path.expanduser(cfg.compile_cache))


def use_compile_cache(cfg: CkptConfig) -> str | None:
    """Point JAX's persistent compilation cache at ``cfg``'s directory, before the next compile.

    Called by ``restart()`` and by the callback's constructor, both before ``fit`` compiles its steps.

    Returns:
        The cache directory JAX uses from now on (the job's own, if it set one), or None: off, the
        backend is not JAX, or the job turned JAX's cache off.
    """
    where = cache_dir(cfg)
    if where is None or keras.backend.backend() != "jax":
        return None
    import jax  # the JAX backend is loaded: this costs nothing

    if not jax.config.jax_enable_compilation_cache:
        return None
    theirs = jax.config.jax_compilation_cache_dir
    if theirs:
        if os.path.abspath(os.path.expanduser(theirs)) != where:
            _LOG.debug("ckpt_compile_cache: JAX's cache is already in %s; %s is not used", theirs, where)
        return theirs
    jax.config.update("jax_compilation_cache_dir", where)
    if jax.config.jax_persistent_cache_min_compile_time_secs == JAX_DEFAULT_MIN_COMPILE_SECS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return where
