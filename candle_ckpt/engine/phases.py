"""Training in phases: a model compiled again between two fits that save into one ``ckpt_directory``.

A checkpoint holds the state of the optimizer of the fit that wrote it, and ``restart()`` loads it into the
optimizer the model has at that moment. A job that compiles the model again between its fits (transfer
learning: a new head trained on a frozen base, the base unfrozen, the model compiled with a lower learning rate
and fit again) replaces that optimizer, so with one directory for both fits a resume cannot be exact: a
``restart()`` before the first fit either cannot load the second fit's optimizer state (a frozen base: other
variables, ``ModelMismatch``) or loads it into an optimizer that the next ``compile()`` throws away.

The recipe is one ``ckpt_directory`` per phase and ``restart()`` before each phase's fit (docs/exactness.rst,
"Training in phases"; ``tests/integration/keras/test_phases.py``). What this module adds is that a job which
does otherwise is told, once per model and directory, at the start of the fit that shows it (from
:meth:`~candle_ckpt.engine.fit_port.FitPlumbing.trains`):

* ``restart()`` loaded the optimizer state into an optimizer that is no longer the model's (compiled again
  since, before any fit trained): the fit starts with a fresh optimizer and the run will not be bit-identical;
* an earlier fit of this model saved into the same directory with another optimizer: said in the first,
  uninterrupted run, while the script can still be changed.

Framework-free: the optimizer is whatever the model's ``optimizer`` attribute holds, compared by identity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.pending import Ref, ref

RECIPE = (
    "give each phase its own ckpt_directory and call restart() before each phase's fit() "
    '(docs/exactness.rst, "Training in phases")'
)
# ModelMismatch's advice when only the optimizer's variables differ (keras/preflight.py).
ONLY_OPTIMIZER = (
    "The model was not changed. Only the optimizer's variables differ: if this checkpoint was written by a later "
    f"fit() of a model compiled again (a base unfrozen), {RECIPE}; else set ckpt_restart_mode=off to start from "
    "scratch."
)
ATTR = "_candle_ckpt_phases"  # on the model: its lifetime is the model's


@dataclass
class _Phases:
    """Per model: the optimizer that holds each directory's state (by realpath), and the directories warned."""

    held: dict[str, Ref] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)


def check(model: Any, directory: str, loaded_into: Ref | None, where: str, log: OpsLog) -> None:
    """A fit of ``model`` that trains and saves into ``directory`` starts: say once if its optimizer is not the one
    that holds the directory's state. ``loaded_into``: for the first fit that trains after a restore, the optimizer
    the restore loaded the state of the checkpoint ``where`` into (``Pending.loaded_into``); else None."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return
    key = os.path.realpath(directory)
    phases = getattr(model, ATTR, None)
    if not isinstance(phases, _Phases):
        phases = _Phases()
        object.__setattr__(model, ATTR, phases)  # bypass Keras's attribute tracking (this is no layer state)
    before = loaded_into if loaded_into is not None else phases.held.get(key)
    phases.held[key] = ref(optimizer)
    if before is None or before() is optimizer or key in phases.warned:
        return
    phases.warned.add(key)
    if loaded_into is not None:
        log.warning(
            f"restart() loaded the optimizer state of {where} into the optimizer the model had then, and the model "
            "was compiled again since: this fit() starts with a fresh optimizer, so the run will not be "
            "bit-identical to an uninterrupted one. Call restart() after the last compile() before fit(); for training "
            f"in phases (fit, compile again, fit), {RECIPE}"
        )
    else:
        log.warning(
            f"this fit() saves into {directory} after an earlier fit() of this model saved there with another "
            "optimizer (the model was compiled again in between): a restart() before the first fit() cannot resume "
            "this fit's checkpoints exactly (the next compile() replaces the optimizer it restores into). For "
            f"training in phases, {RECIPE}"
        )
