"""Which adapter serves a model: Keras 3 or tf_keras (Keras 2); the front door of ``restart()``.

The one place that knows both adapters. The layers below it (``keras``, ``tf_keras``,
``distributed``, ``engine``) import none of it: ``restart()`` and
``WorkerTrainingState`` are here, above both adapters, and pick one for the model
they are given. The adapter modules are imported lazily, so asking "is this a
tf_keras model?" imports neither Keras.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from candle_ckpt.distributed import worker_state
from candle_ckpt.distributed.cluster import is_tf_keras

__all__ = ["WorkerTrainingState", "default_adapter", "is_tf_keras", "restart"]


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
        the number of completed epochs: pass it as ``initial_epoch``, as CANDLE
        does; the first ``fit`` that trains after this starts after it anyway,
        as Keras's ``BackupAndRestore`` makes it; ``"step"`` is None, or the
        steps done in the next epoch), or None.
    """
    from candle_ckpt.keras.restart import restart as restart_model

    return restart_model(
        gParameters, model, logger, verbose, adapter=default_adapter(model) if is_tf_keras(model) else None
    )
