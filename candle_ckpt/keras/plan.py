"""The save plan: which variable goes to which H5 path, found the way ``save_weights`` walks a model.

It relies on Keras's private ``_save_state`` walk (through
:mod:`candle_ckpt.keras.internals`): we hand it a recording store, so we learn which variables go to
which H5 path without writing anything. That plan lets
:class:`~candle_ckpt.keras.state.ModelState` take a host snapshot (one copy of
each variable) and later write a standard ``.weights.h5`` from it on any
thread, while training goes on.

Restoring into the model is :mod:`candle_ckpt.keras.preflight` (its optimizer built first) and
:mod:`candle_ckpt.keras.adapter`.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from candle_ckpt.keras import internals


@dataclass
class Entry:
    """One H5 group: its path, its attributes and its ``(key, value)`` pairs."""

    path: str
    metadata: dict[str, Any]
    items: list[tuple[str, Any]] = field(default_factory=list)
    # True when save_own_variables handed us copies we could not map back to
    # variables: such a plan must be re-walked for every snapshot.
    volatile: bool = False


class _PlanStore(internals.H5IOStore):
    """A weights store that records instead of writing (see module docstring)."""

    def __init__(self) -> None:  # deliberately no super().__init__: no file
        self.mode = "w"
        self.entries: list[Entry] = []

    def __bool__(self) -> bool:
        return True

    def make(self, path, metadata=None):
        self.entries.append(Entry(path, dict(metadata or {})))
        return self

    def __setitem__(self, key, value) -> None:
        self.entries[-1].items.append((str(key), value))

    def close(self) -> None:
        pass


def is_built(model: Any) -> bool:
    """Built, or with variables and every layer it holds built: a model with no ``call``, trained by a
    ``train_step`` of its own (Keras's VAE and GAN examples), stays unbuilt for good though nothing is left to
    create (Keras's ``save_weights`` refuses it; we do not)."""
    return bool(model.built or (model.variables and all(layer.built for layer in model.layers)))


def attribute_optimizers(model: Any) -> dict[str, Any]:
    """The optimizers ``model`` holds in attributes of its own besides ``model.optimizer``, by attribute name (the
    path Keras's weights file gives each): a GAN's ``d_optimizer`` and ``g_optimizer``, set in its ``compile``."""
    return {
        name: value
        for name, value in vars(model).items()
        if isinstance(value, keras.optimizers.Optimizer) and name != "optimizer"
    }


def optimizers_of(obj: Any) -> list[Any]:
    """The optimizers reachable from ``obj`` (a model's own, those in its attributes, wrapped ones, or ``obj``
    itself)."""
    found: list[Any] = []
    if isinstance(obj, keras.optimizers.Optimizer):
        roots = [obj]
    else:
        roots = [getattr(obj, "optimizer", None), *attribute_optimizers(obj).values()]
    for opt in roots:
        while opt is not None and all(opt is not o for o in found):
            found.append(opt)
            opt = getattr(opt, "inner_optimizer", None)
    return found


def _hand_over_variables(optimizer: Any, store: Any) -> None:
    """``BaseOptimizer.save_own_variables`` as it would store them, but the variables, not ``numpy()`` copies."""
    for i, variable in enumerate(optimizer.variables):
        store[str(i)] = variable


@contextlib.contextmanager
def _variables_not_copies(optimizers: list[Any]):
    """While the plan is walked, optimizers that save the stock way hand over their variables.

    Stock ``save_own_variables`` stores ``variable.numpy()`` of every slot: with
    Adam, two copies of the weights' size (about 1 s at 768 MiB of state), only
    for the plan to map them back to the variables by position. Optimizers that
    override the method keep it (their entries are mapped back or marked volatile).
    """
    stock = internals.stock_save_own_variables()
    patched = [o for o in optimizers if type(o).save_own_variables is stock and "save_own_variables" not in vars(o)]
    for opt in patched:
        object.__setattr__(opt, "save_own_variables", functools.partial(_hand_over_variables, opt))
    try:
        yield
    finally:
        for opt in patched:
            object.__delattr__(opt, "save_own_variables")


def make_plan(obj: Any, extra_optimizers: tuple = (), *, optimizers: bool = True) -> list[Entry]:
    """Return the save plan of a Keras model (or any KerasSaveable).

    Layers hand ``save_own_variables`` their variables; optimizers hand it
    ``variable.numpy()`` copies, in ``optimizer.variables`` order. Those are
    mapped back to the variables so that the plan can be reused; anything else
    that is not a variable marks its entry volatile.

    With ``optimizers=False`` the optimizers are left out of the walk: a plan
    of the layers' variables only, which costs no copy of the optimizer state
    (two copies of the weights' size with Adam).
    """
    store = _PlanStore()
    known = optimizers_of(obj) + list(extra_optimizers)
    skip = set() if optimizers else {id(o) for o in optimizers_of(obj)}
    with _variables_not_copies(known if optimizers else []):
        internals.save_state(obj, store, skip)
    plan = []
    for entry in store.entries:
        if not (entry.metadata or entry.items):
            continue
        if any(not isinstance(v, keras.Variable) for _, v in entry.items):
            opt = next(
                (o for o in known if o.name == entry.metadata.get("name") and len(o.variables) == len(entry.items)),
                None,
            )
            if opt is not None and all(
                k == str(i) and tuple(np.shape(v)) == tuple(var.shape)
                for i, ((k, v), var) in enumerate(zip(entry.items, opt.variables, strict=True))
            ):
                entry.items = [(str(i), var) for i, var in enumerate(opt.variables)]
            else:
                entry.volatile = True
        plan.append(entry)
    return plan
