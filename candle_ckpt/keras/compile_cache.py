"""JAX's persistent compilation cache in the fast tier (``ckpt_compile_cache``): a restart loads what it compiled.

A restarted JAX job compiles again everything the interrupted one compiled: the layers' initializers, the
optimizer's variables, the train and the validation step. With the cache, each compiled executable is written once
(by process 0, JAX's own rule) and a restart reads it back in milliseconds. docs/performance.rst ("Restarts:
start-up") has the measurements and the trade.

The rules:

* ``auto`` (the default) puts the cache in ``<ckpts>/compile-cache`` (:attr:`Layout.compile_cache
  <candle_ckpt.core.layout.Layout.compile_cache>`), beside the checkpoints and in the same tier; ``off`` leaves
  JAX alone; any other value is the directory to use.
* A directory the job already gave JAX (``jax.config.update("jax_compilation_cache_dir", ...)`` or
  ``JAX_COMPILATION_CACHE_DIR``) is kept: JAX builds its cache once per process, so the first directory set
  stays, and so does ``jax_enable_compilation_cache=False``.
* JAX writes only what took a second or more to compile by default; on a restart every compile counts, so the
  threshold goes to 0 unless the job set one of its own.
* Only the JAX backend has it; on the others this does nothing.

Nothing else reads the directory: it is not a checkpoint, so listing, verifying, pruning and the drain to the
persistent tier never see it.
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
