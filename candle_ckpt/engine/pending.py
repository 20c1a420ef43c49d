"""Apply, when training starts, what a restore could not apply yet (no keras here).

``restart()`` attaches a :class:`~candle_ckpt.engine.resume.Resumed` to the
model. Two things in it may wait for ``fit``:

* the optimizer state, when ``restart()`` ran before ``compile()`` (as the
  ECP-CANDLE benchmarks do): the optimizer did not exist. A guard warns at
  garbage collection or exit if no callback ever applied it;
* the training state (callbacks, RNGs, input position): it belongs to
  objects that only exist in ``fit``.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.resume import Resumed

OPTIMIZER = "optimizer"
TRAIN_STATE = "train_state"
_GUARD = "guard"


def _never_applied(ops: OpsLog, message: str) -> None:
    ops.warning(message)
    print(f"candle_ckpt WARNING: {message}", file=sys.stderr, flush=True)


def guard_optimizer(model: Any, resumed: Resumed, ops: OpsLog, where: str) -> None:
    """Say what happens to optimizer state kept for later, and warn loudly if it is never applied."""
    arrays = resumed.pending.get(OPTIMIZER)
    if arrays is None:
        return
    ops.info(
        f"restart: the model has no optimizer yet (restart() before compile()); the optimizer state of {where} "
        f"({len(arrays)} variables) is kept and applied when fit() starts with CandleCheckpointCallback"
    )
    message = (
        f"the optimizer state restored from {where} was never applied: no CandleCheckpointCallback started a fit "
        "of this model, so its optimizer started fresh and the run is not a true resume; pass the callback to "
        "fit(), or call restart() after compile()"
    )
    resumed.pending[_GUARD] = weakref.finalize(model, _never_applied, ops, message)


def take(resumed: Resumed | None, key: str) -> Any:
    """Remove and return one pending item (the optimizer's also disarms its guard)."""
    if resumed is None or key not in resumed.pending:
        return None
    value = resumed.pending.pop(key)
    if key == OPTIMIZER and _GUARD in resumed.pending:
        resumed.pending.pop(_GUARD).detach()
    return value
