"""The rule for a finished run, rerun unchanged: train nothing and say so in one line.

A run is finished when a callback (``EarlyStopping``) or a stop condition
ended it after the epoch of its newest checkpoint, or when that checkpoint
has reached the run's epoch limit. Rerunning the same command must then
restore that checkpoint and train no further. Every way of training uses
this one rule and its one line, through the run
(:meth:`~candle_ckpt.engine.run.TrainingRun.finished`): the Keras 3 and
tf_keras callbacks (whose ``fit`` the run then starts past its last epoch,
through the framework's port, :mod:`candle_ckpt.engine.fit_port`) and
``JobRunner`` (whose loop runs no epoch).

To train on on purpose: after a stop, ask for the epoch explicitly
(``ckpt_restart_epoch=N``, an explicit request is always honoured); after
the epoch limit, raise it. Both are in the line.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.core.sidecar import Sidecar


def finished_line(
    side: Sidecar,
    where: str,
    *,
    ended: tuple[str, int] | None = None,
    epochs: Any = None,
    restart_epoch: int | None = None,
    call: str = "fit()",
    limit: str | None = None,
) -> str | None:
    """The one line for a rerun of the run whose checkpoint is ``side``, or None if that run is not finished.

    Args:
        side: The sidecar of the checkpoint restored (``epoch`` = completed epochs).
        where: Its directory, as the log names it.
        ended: ``(what ended the run, after which epoch)`` as recorded at that checkpoint's save.
        epochs: The epoch limit of this rerun (``fit``'s ``epochs``); anything but an int: none.
        restart_epoch: ``ckpt_restart_epoch``: an explicit request, never "finished" after a stop.
        call: What trains nothing, as the user calls it.
        limit: How the line names the limit (default ``"<call> was called with epochs=<epochs>"``).
    """
    if ended is not None and side.step is None and restart_epoch is None:
        why = f"{ended[0]} ended it after epoch {ended[1]}"
        how = f"to train on from there on purpose, set ckpt_restart_epoch={side.epoch}"
    elif isinstance(epochs, int) and not isinstance(epochs, bool) and side.epoch >= epochs:
        why = f"its checkpoint is of epoch {side.epoch} and {limit or f'{call} was called with epochs={epochs}'}"
        how = f"to train on, pass epochs > {side.epoch}"
    else:
        return None
    return f"the run is finished: {why} ({where}); this {call} trains nothing; {how}"
