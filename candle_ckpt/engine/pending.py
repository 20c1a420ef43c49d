"""What a restore could not apply yet and waits for ``fit``: one typed record (no keras here).

A restore fills a :class:`Pending`; ``restart()`` hands it to the callback in
the :class:`~candle_ckpt.engine.resume.Resumed` it attaches to the model
(``Resumed.pending``), and the callback takes each item when ``fit`` starts.
Two things may wait:

* the optimizer state (:class:`ParkedOptimizer`), when ``restart()`` ran before
  ``compile()`` (as the ECP-CANDLE benchmarks do): the optimizer did not exist.
  This holds for our checkpoints, tf_keras ones and CANDLE's own ``model.h5``.
  :meth:`Pending.guard` warns at garbage collection or exit if it is never taken;
* the training state (callbacks, RNGs, input position): it belongs to
  objects that only exist in ``fit``.

The first fit that trains after the restore (:meth:`Pending.first_fit`) starts after the restored epoch and
checks that the model still has the optimizer the state was loaded into (``loaded_into``;
:mod:`candle_ckpt.engine.phases`: a model compiled again after ``restart()``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.core.log import OpsLog

Ref = Callable[[], Any]  # an object, through a reference that does not keep it alive (see ref)


@dataclass(frozen=True)
class ParkedOptimizer:
    """Optimizer variables read before the model had an optimizer.

    Attributes:
        values: The saved arrays, in the order of the optimizer's variables.
        names: The saved names of ``values`` where the checkpoint has them
            (tf_keras), for the messages.
    """

    values: list[Any]
    names: list[str] | None = None


@dataclass
class Pending:
    """State a restore could not apply yet; the callback applies it when ``fit`` starts.

    Attributes:
        optimizer: The optimizer state, when the model had no optimizer yet.
        train_state: The ``train.state.npz`` bytes (callbacks, RNGs, input position).
        loaded_into: The optimizer the restore loaded the state into (a weak reference), when the model had one.
    """

    optimizer: ParkedOptimizer | None = None
    train_state: bytes | None = None
    loaded_into: Ref | None = None
    _guard: weakref.finalize | None = field(default=None, repr=False, compare=False)
    _fit: bool = field(default=False, repr=False, compare=False)

    def guard(self, model: Any, log: OpsLog, where: str) -> None:
        """Say what happens to a parked optimizer state, and warn loudly if it is never applied; else remember the
        optimizer the state was loaded into."""
        if self.optimizer is None:
            optimizer = getattr(model, "optimizer", None)
            self.loaded_into = ref(optimizer) if optimizer is not None else None
            return
        log.info(
            f"restart: the model has no optimizer yet (restart() before compile()); the optimizer state of {where} "
            f"({len(self.optimizer.values)} variables) is parked and applied when fit() starts with "
            "CandleCheckpointCallback"
        )
        message = (
            f"the optimizer state restored from {where} was never applied: no CandleCheckpointCallback started a "
            "fit of this model, so its optimizer started fresh and the run is not a true resume; pass the callback "
            "to fit(), or call restart() after compile()"
        )
        self._guard = weakref.finalize(model, _never_applied, log, message)

    def take_optimizer(self) -> ParkedOptimizer | None:
        """Remove and return the parked optimizer state (None if there is none); disarms the guard."""
        parked, self.optimizer = self.optimizer, None
        if self._guard is not None:
            self._guard.detach()
            self._guard = None
        return parked

    def first_fit(self) -> bool:
        """True the first time it is asked: by the first fit that trains after the restore."""
        first, self._fit = not self._fit, True
        return first

    def take_train_state(self) -> bytes | None:
        """Remove and return the training state (None if there is none)."""
        data, self.train_state = self.train_state, None
        return data


def ref(obj: Any) -> Ref:
    """A reference to ``obj`` that does not keep it alive (a strong one where it cannot be weak)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _never_applied(log: OpsLog, message: str) -> None:
    log.warning(message)
    print(f"candle_ckpt WARNING: {message}", file=sys.stderr, flush=True)
