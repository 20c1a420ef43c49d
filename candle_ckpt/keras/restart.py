"""``restart()``: resume a job from its newest valid checkpoint.

The choice, verification, load and restart history are the one restore driver's
(:func:`candle_ckpt.engine.restore.restore`), also called by the epoch runner and
:class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`; this module gives it
one Keras 3 model's adapter, and hands models of a multi-worker strategy to
``WorkerTrainingState`` (the chief chooses for every worker). A tf_keras model
comes through :func:`candle_ckpt.adapters.restart` (the public ``candle_ckpt.restart``),
which gives it its adapter: this layer imports no other adapter.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import keras

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.group import scoped
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.distributed.cluster import is_tf_keras
from candle_ckpt.distributed.worker_state import WorkerTrainingState, multi_worker_strategy
from candle_ckpt.engine.restore import restore
from candle_ckpt.engine.resume import attach_resumed, checkpoint_dir
from candle_ckpt.engine.signals import hold_signals
from candle_ckpt.keras import internals
from candle_ckpt.keras.adapter import KerasModelAdapter
from candle_ckpt.keras.preflight import build_optimizer
from candle_ckpt.multihost.compile_cache import use_compile_cache
from candle_ckpt.multihost.save import keras_group


def restart(
    gParameters: Mapping[str, Any],
    model,
    logger: str | logging.Logger | None = "DEFAULT",
    verbose: bool = True,
    *,
    adapter: Any = None,
) -> dict[str, Any] | None:
    """Restore a Keras 3 ``model`` from the newest valid checkpoint: :func:`candle_ckpt.restart` (defined in
    :mod:`candle_ckpt.adapters`) says what it does; it calls this for every model, with ``adapter`` for a tf_keras
    one.

    Args:
        adapter: The capture/restore adapter of a model that is not Keras 3's (a tf_keras model's). The
            checkpoint is then chosen and loaded through ``WorkerTrainingState``, as for a multi-worker strategy.
    """
    cfg = CkptConfig.from_params(gParameters)
    hold_signals(cfg)  # from now on a preemption signal is held for fit's first step (docs/preemption.rst)
    if keras.backend.backend() == "jax":
        use_compile_cache(cfg)  # fit's compiles after a restart are read back (multihost/compile_cache.py)
    if not cfg.restores():
        return None
    if adapter is None and is_tf_keras(model):
        raise TypeError(
            "candle_ckpt.keras.restart.restart() restores Keras 3 models; this is a tf_keras (Keras 2) model: "
            "call candle_ckpt.restart(gParameters, model), which picks the tf_keras adapter"
        )
    if adapter is not None or multi_worker_strategy(model) is not None:
        return _restart_through_worker(gParameters, model, adapter or KerasModelAdapter(model), logger, verbose)
    group = keras_group()
    if group.size > 1:  # several JAX processes: the primary chooses, all load the same one or none
        from candle_ckpt.multihost.group_restart import restart_group

        def prepare() -> None:  # the restore's first work, on all, watched (a peer that never comes: exit 124)
            # No Keras variable may be made on only some processes (a collective under a distribution)
            internals.warm_skipsets()
            if getattr(model, "optimizer", None) is not None:
                build_optimizer(model)

        return restart_group(cfg, model, scoped(group, "restore"), logger, verbose, KerasModelAdapter, prepare)
    return _restart_keras(cfg, model, logger, verbose)


def _restart_through_worker(
    gParameters: Mapping[str, Any], model, adapter: Any, logger: str | logging.Logger | None, verbose: bool
) -> dict[str, Any] | None:
    """A tf_keras model, or one under a multi-worker strategy: the chief chooses for every worker."""
    worker = WorkerTrainingState(gParameters, model, adapter=adapter, logger=logger, verbose=verbose, writable=False)
    found = worker.restore(timeout_exits=True)  # a worker stuck or gone: a hang (exit 124), as in a JAX group
    attach_resumed(model, worker.resumed)
    if worker.resumed is not None:
        worker.resumed.pending.guard(model, worker.log, checkpoint_dir(worker.layout, worker.resumed.sidecar))
    return found


def _restart_keras(cfg: CkptConfig, model, logger: str | logging.Logger | None, verbose: bool) -> dict[str, Any] | None:
    """A Keras 3 model in this process: the restore driver, through :class:`KerasModelAdapter`."""
    log = OpsLog(L.Layout.of(cfg).log, get_logger(logger, verbose))
    adapter = KerasModelAdapter(model)  # first: a model that is none is a TypeError naming it
    attach_resumed(model, None)
    resumed = restore(cfg, log, adapter, mapped=True)
    if resumed is None:
        return None
    # What was restored travels with the model: the run adopts it when fit starts.
    attach_resumed(model, resumed)
    resumed.pending.guard(model, log, checkpoint_dir(L.Layout.of(cfg), resumed.sidecar))
    return resumed.sidecar.to_dict()
