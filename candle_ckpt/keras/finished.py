"""A finished run, rerun unchanged: ``fit`` trains nothing and one line says so (Keras 3).

The rule and its line are :mod:`candle_ckpt.engine.finished`'s. A run is
finished when ``EarlyStopping`` ended it (recorded in the checkpoint of the
epoch it stopped after, see :func:`stopped_by`) or when its checkpoint has
reached ``fit``'s ``epochs``. Rerunning the same command then restores
that checkpoint and trains no further: without this, ``EarlyStopping`` would
start counting again and train more epochs than the first run did.

To train on on purpose: after ``EarlyStopping``, ask for the epoch
explicitly (``ckpt_restart_epoch=N``); after the last epoch, pass a larger
``epochs``. Both are in the message.
"""

from __future__ import annotations

from typing import Any

import keras

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.finished import finished_line
from candle_ckpt.engine.resume import Resumed
from candle_ckpt.keras import internals
from candle_ckpt.keras.train_state import unpack


def stopped_by(callbacks: list[Any], model: Any, epoch: int) -> str | None:
    """At the save of Keras's epoch index ``epoch``: the class of the callback that ended training for good.

    Only ``EarlyStopping`` counts: a callback that stops for the time budget
    (CANDLE's ``TerminateOnTimeOut``) or our own preemption stop leaves the run unfinished.
    """
    if not getattr(model, "stop_training", False):
        return None
    for cb in callbacks:
        if isinstance(cb, keras.callbacks.EarlyStopping) and cb.stopped_epoch == epoch:
            return type(cb).__name__
    return None


def stop_if_finished(
    model: Any,
    resumed: Resumed | None,
    train_state: bytes | None,
    cfg: CkptConfig,
    epochs: Any,
    where: str,
    log: OpsLog,
) -> bool:
    """At ``on_train_begin``: if the run is finished, make ``fit`` run no epoch and say so in one line."""
    if resumed is None:
        return False
    epochs = epochs if isinstance(epochs, int) else cfg.epochs
    done = unpack(train_state)[0].get("finished") if train_state is not None else None
    ended = (done["by"], done["epoch"]) if done else None
    line = finished_line(resumed.sidecar, where, ended=ended, epochs=epochs, restart_epoch=cfg.restart_epoch)
    if line is None:
        return False
    log.warning(line)
    if isinstance(epochs, int):
        internals.set_first_epoch(model, epochs)
    return True


def release(model: Any) -> None:
    """At ``on_train_end`` of a finished run's fit: a later ``fit`` of the model starts where it is told."""
    internals.set_first_epoch(model, None)
