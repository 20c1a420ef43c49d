"""``restart()``: resume a job from its newest valid checkpoint.

The shared half (remote pull, choice of the checkpoint, CRC verification,
load statistics) is :mod:`candle_ckpt.engine.resume`, also used by the epoch runner
and :class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`; this module loads
one Keras 3 model, and hands tf_keras models and models of a multi-worker
strategy to ``WorkerTrainingState`` (the chief chooses for every worker).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from candle_ckpt.adapters import WorkerTrainingState, is_tf_keras
from candle_ckpt.config.params import CkptConfig
from candle_ckpt.config.signals import signal_numbers
from candle_ckpt.core import layout as L
from candle_ckpt.core.group import scoped
from candle_ckpt.core.log import OpsLog, get_logger
from candle_ckpt.distributed.worker_state import multi_worker_strategy
from candle_ckpt.engine.decision import checkpointing_off
from candle_ckpt.engine.preempt import catch_early
from candle_ckpt.engine.resume import Resumed, attach_resumed, checkpoint_dir, load_chosen, select_checkpoint
from candle_ckpt.keras.adapter import KerasModelAdapter
from candle_ckpt.keras.sharded import keras_group


def restart(
    gParameters: Mapping[str, Any], model, logger: str | logging.Logger | None = "DEFAULT", verbose: bool = True
) -> dict[str, Any] | None:
    """Restore ``model`` (weights and optimizer state) from the newest valid checkpoint.

    ``ckpt_restart_mode``:

    * ``off``: return None and touch nothing.
    * ``auto``: resume from ``last``; if it is missing, dangling, fails its
      CRC or has a broken sidecar, log why and fall back to the newest valid
      checkpoint (by commit order). None if there is none.
    * ``required``: as auto, but raise :class:`NoValidCheckpoint` if none is valid.

    ``ckpt_restart_epoch`` restores exactly that epoch (a rollback) and raises
    :class:`NoValidCheckpoint` if it is missing or invalid.

    With a persistent tier (``ckpt_persistent_url``) the newer of the two tiers' valid checkpoints is
    taken; a persistent one is fetched into ``ckpt_directory`` and verified first (docs/campaigns.rst).

    Every file's CRC is verified, and every variable's shape, dtype and count
    compared with the model, before anything is loaded into it: on a
    mismatch the model is untouched and :class:`~candle_ckpt.core.errors.ModelMismatch`
    names the first differing variables.

    It may be called before ``compile()``: the optimizer state is then parked
    and applied by :class:`~candle_ckpt.keras.callback.CandleCheckpointCallback`
    when ``fit`` starts (a warning at exit says so if that never happens).
    What was restored is attached to ``model``; the callback reads it from
    there, whether it was created before or after this call.

    A tf_keras (Keras 2) model is restored from a tf_keras checkpoint (see
    :mod:`candle_ckpt.tf_keras.adapter`). Under a multi-worker ``tf.distribute``
    strategy (the model was built in its scope) call it on every worker: the
    chief chooses the checkpoint and every worker loads that one (see
    :class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`).

    A step checkpoint (``ckpts/steps/GGG``: a preemption save or
    ``ckpt_save_steps``) committed after ``last`` is preferred to it: its
    ``"step"`` says how many steps of the next epoch were done, and the
    callback makes ``fit`` continue with the next unseen batch of that epoch.

    Returns:
        The restored checkpoint's ``ckpt-info.json`` as a dict (``"epoch"`` is
        the number of completed epochs: pass it as ``initial_epoch``; ``"step"``
        is None, or the steps done in the next epoch), or None.
    """
    cfg = CkptConfig.from_params(gParameters)
    if not checkpointing_off(cfg):  # from now on a preemption signal is held for fit's first step (docs/preemption.rst)
        catch_early(signal_numbers(cfg.preempt_signals))
    if not cfg.restores():
        return None
    if is_tf_keras(model) or multi_worker_strategy(model) is not None:
        return _restart_through_worker(gParameters, model, logger, verbose)
    group = keras_group()
    if group.size > 1:  # several JAX processes: the primary chooses, all load the same one or none
        from candle_ckpt.keras.group_restart import restart_group

        return restart_group(cfg, model, scoped(group, "restore"), logger, verbose)
    return _restart_keras(cfg, model, logger, verbose)


def _restart_through_worker(
    gParameters: Mapping[str, Any], model, logger: str | logging.Logger | None, verbose: bool
) -> dict[str, Any] | None:
    """A tf_keras model, or one under a multi-worker strategy: the chief chooses for every worker."""
    worker = WorkerTrainingState(gParameters, model, logger=logger, verbose=verbose, writable=False)
    found = worker.restore()
    attach_resumed(model, worker.resumed)
    if worker.resumed is not None:
        worker.resumed.pending.guard(model, worker.log, checkpoint_dir(worker.layout, worker.resumed.sidecar))
    return found


def _restart_keras(cfg: CkptConfig, model, logger: str | logging.Logger | None, verbose: bool) -> dict[str, Any] | None:
    """A Keras 3 model in this process: choose, verify and load through :class:`KerasModelAdapter`."""
    log = OpsLog(L.Layout.of(cfg).log, get_logger(logger, verbose))
    adapter = KerasModelAdapter(model)
    start = time.perf_counter()
    attach_resumed(model, None)
    chosen = select_checkpoint(cfg, log, reads=adapter.reads, mapped=True, steps=True)
    if chosen is None:
        return None
    record = load_chosen(cfg, log, adapter, chosen, time.perf_counter() - start)
    # What was restored travels with the model: the callback reads it when fit starts.
    resumed = Resumed(os.path.realpath(cfg.directory), chosen.sidecar, record, adapter.pending)
    attach_resumed(model, resumed)
    resumed.pending.guard(model, log, checkpoint_dir(L.Layout.of(cfg), chosen.sidecar))
    return chosen.sidecar.to_dict()
