"""Check a checkpoint against a Keras 3 model before anything is assigned.

A restore is all or nothing: every variable's shape, dtype and count is
compared with the model first, and on any difference the model is left
untouched and :class:`ModelMismatch` says, in a few lines, which checkpoint,
which variables and what to do. Only then are values assigned.

It also reads the optimizer state of a checkpoint on its own, for a model
that has no optimizer yet (``restart()`` called before ``compile()``): that
state is parked and applied once the optimizer exists (:func:`apply_optimizer_state`).

Trap handled here: a freshly compiled model has no optimizer variables until its first step, and stock
``load_weights`` then silently skips the optimizer state. :func:`build_optimizer` builds it before anything is read.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable
from typing import Any

import h5py
import keras
import numpy as np

from candle_ckpt.core.dtypes import counter_fits
from candle_ckpt.core.fileobj import BufferFile
from candle_ckpt.engine.mismatch import Diff, mismatch, model_mismatch
from candle_ckpt.engine.mismatch import shape_text as _shape
from candle_ckpt.keras import internals
from candle_ckpt.keras.plan import Entry, attribute_optimizers, is_built, make_plan


def _saved_vars(h5: h5py.File, path: str) -> dict[str, h5py.Dataset]:
    group = h5.get(f"{path}/vars" if path else "vars")
    return {} if group is None else {k: v for k, v in group.items() if isinstance(v, h5py.Dataset)}


def _dtype(dataset: h5py.Dataset) -> str:
    return str(dataset.attrs.get("dtype", keras.backend.standardize_dtype(dataset.dtype)))


def _dtype_fits(data: h5py.Dataset, model_dtype: str) -> bool:
    """The saved values load into the model's dtype unchanged (:func:`~candle_ckpt.core.dtypes.counter_fits`)."""
    return counter_fits(_dtype(data), model_dtype, data.size, lambda: data[()])


def compare_entries(plan: list[Entry], h5: h5py.File) -> tuple[list[Diff], int]:
    """Compare a save plan with a ``.weights.h5``; return (differences, variables compared)."""
    diffs: list[Diff] = []
    count = 0
    planned = set()
    for entry in plan:
        planned.add(entry.path)
        saved = _saved_vars(h5, entry.path)
        for key, var in entry.items:  # the wording (engine/mismatch) only for a difference
            count += 1
            data, dtype = saved.get(key), keras.backend.standardize_dtype(var.dtype)
            same = data is not None and tuple(map(int, data.shape)) == tuple(map(int, var.shape))
            if same and _dtype_fits(data, dtype):
                continue
            name = f"{entry.path}/vars/{key}" + (f" ({var.path})" if hasattr(var, "path") else "")
            have = "nothing" if data is None else f"{_shape(data.shape)} {_dtype(data)}"
            diffs.append(Diff(name, have, f"{_shape(var.shape)} {dtype}"))
        for key in sorted(set(saved) - {k for k, _ in entry.items}):
            diffs.append(Diff(f"{entry.path}/vars/{key}", _shape(saved[key].shape), "nothing"))
    extra: list[str] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and "/vars/" in f"/{name}":
            path = f"/{name}".rsplit("/vars/", 1)[0].lstrip("/")
            if path not in planned:
                extra.append(name)

    h5.visititems(visit)
    diffs.extend(Diff(name, _shape(h5[name].shape), "nothing") for name in extra)
    return diffs, count


def compare_extra(data: bytes | None, variables: list[Any]) -> list[Diff]:
    """Compare ``model.extra.npz`` (random-layer seed states) with the model's such variables."""
    if data is None:
        return []
    with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as npz:
        paths = [str(p) for p in npz["paths"]]
        shapes = [npz[f"v{i}"].shape for i in range(len(paths))]
    if len(paths) != len(variables):
        return [
            Diff(
                "random-layer seed states",
                f"{len(paths)} ({', '.join(paths) or 'none'})",
                f"{len(variables)} ({', '.join(v.path for v in variables) or 'none'})",
            )
        ]
    return [
        Diff(var.path, _shape(shape), _shape(var.shape))
        for shape, var in zip(shapes, variables, strict=True)
        if tuple(shape) != tuple(var.shape)
    ]


def check_model(
    model: keras.Model,
    weights: Any,
    extra: bytes | None,
    extra_vars: list[Any],
    where: str,
    epoch: int,
    plan: list[Entry] | None = None,
    late: Iterable[str] = (),
):
    """Raise :class:`ModelMismatch` unless every variable of the checkpoint fits ``model``.

    The optimizer is compared only if the model has one (its variables are
    built first); otherwise the checkpoint's optimizer state is returned
    for later (:func:`read_optimizer_state`). ``plan`` is the model's
    :func:`make_plan` where the caller has it already. Those named in ``late`` are checked when built.
    """
    has_optimizer = getattr(model, "optimizer", None) is not None
    if has_optimizer:
        build_optimizer(model, weights)
    if plan is None:
        plan = make_plan(model, optimizers=has_optimizer)
    compare = compare_entries if has_optimizer else _layers_only
    diffs, compared = _read_h5(weights, lambda h5: compare(plan, h5))
    prefixes = tuple(f"{name}/" for name in late)
    diffs = [d for d in diffs if not (prefixes and d.where.startswith(prefixes))]
    diffs += compare_extra(extra, extra_vars)
    if diffs:
        raise model_mismatch(where, epoch, diffs, compared)


def _layers_only(plan: list[Entry], h5: h5py.File) -> tuple[list[Diff], int]:
    """Compare without the optimizer groups (a model without an optimizer yet)."""
    diffs, compared = compare_entries(plan, h5)
    return [d for d in diffs if not d.where.startswith("optimizer")], compared


def read_optimizer_state(weights: Any, path: str = "optimizer") -> list[np.ndarray] | None:
    """The checkpoint's variables of the optimizer at ``path`` (``path/vars/0..n-1``) as owned arrays, or None."""

    def read(h5: h5py.File) -> list[np.ndarray] | None:
        saved = _saved_vars(h5, path)
        return [np.array(saved[str(i)]) for i in range(len(saved))] or None

    return _read_h5(weights, read)


def _read_h5(weights: Any, read: Any) -> Any:
    """``read(h5)`` of the ``.weights.h5`` bytes ``weights``, opened in place."""
    source = BufferFile(weights)
    try:
        with h5py.File(source, "r") as h5:
            return read(h5)
    finally:
        source.close()


def late_optimizers(model: keras.Model) -> dict[str, Any]:
    """The optimizers in ``model``'s attributes not built yet, by path (a GAN's ``d_optimizer`` before its
    first ``apply_gradients``): their state is loaded when Keras builds them (:func:`load_when_built`)."""
    return {name: opt for name, opt in attribute_optimizers(model).items() if not opt.built}


def load_when_built(opt: Any, arrays: list[np.ndarray] | None, where: str, name: str) -> None:
    """Assign ``arrays`` to ``opt``'s variables once Keras builds it (in the first train step, maybe tracing it),
    before its first update: checked all or nothing, then assigned eagerly (``tf.init_scope`` on TensorFlow).

    Raises (from that build): ModelMismatch: the variables built do not fit the saved ones.
    """
    if arrays is None:
        return
    stock = opt.build

    def build_then_load(variables: Any) -> None:
        stock(variables)
        del opt.build  # the class's build again
        diffs = _state_diffs(arrays, opt.variables)
        if diffs:
            header = f"the state of {name} restored from {where} does not fit the optimizer Keras built:"
            raise mismatch(
                header, diffs, f"Apply {name} to the variables it was applied to when the checkpoint was saved."
            )
        scope = contextlib.nullcontext()
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf  # noqa: PLC0415

            scope = tf.init_scope()
        with scope:
            for value, var in zip(arrays, opt.variables, strict=True):
                var.assign(value)

    opt.build = build_then_load


def _state_diffs(arrays: list[np.ndarray], variables: list[Any]) -> list[Diff]:
    """How saved optimizer arrays differ from an optimizer's variables: in count, or the shapes that differ."""
    if len(variables) != len(arrays):
        return [Diff("optimizer variables", str(len(arrays)), f"{len(variables)} (a different optimizer?)")]
    return [
        Diff(f"optimizer/vars/{i} ({var.path})", _shape(a.shape), _shape(var.shape))
        for i, (a, var) in enumerate(zip(arrays, variables, strict=True))
        if tuple(a.shape) != tuple(var.shape)
    ]


def apply_optimizer_state(model: keras.Model, arrays: list[np.ndarray], where: str) -> None:
    """Assign optimizer state read by :func:`read_optimizer_state`, all or nothing.

    Raises:
        ModelMismatch: the optimizer has another number or shape of variables.
    """
    for a, var in zip(arrays, check_optimizer_state(model, arrays, where), strict=True):
        var.assign(a)


def check_optimizer_state(model: keras.Model, arrays: list[np.ndarray], where: str) -> list[Any]:
    """Build ``model``'s optimizer and return its variables if ``arrays`` fit them; change nothing else.

    Raises:
        ModelMismatch: the optimizer has another number or shape of variables.
    """
    build_optimizer(model)
    variables = list(model.optimizer.variables)
    diffs = _state_diffs(arrays, variables)
    if diffs:
        header = f"the optimizer state restored from {where} does not fit the model's optimizer:"
        raise mismatch(
            header, diffs, "The optimizer was not changed. Compile with the optimizer the checkpoint was saved with."
        )
    return variables


def build_optimizer(model: keras.Model, weights: Any = None) -> None:
    """Create the optimizer's variables so that its state can be loaded; not where the checkpoint ``weights``
    holds it unbuilt (as many variables as it has now): its ``train_step`` never used it (a GAN's)."""
    if not (model.built or is_built(model)):  # the common case answered here, without the layers
        raise ValueError(
            "restart() needs a built model: build it (call it on data, model.build(), or use an Input layer) first"
        )
    opt = getattr(model, "optimizer", None)
    if opt is None or opt.built:
        return
    saved = _read_h5(weights, lambda h5: len(_saved_vars(h5, "optimizer"))) if weights is not None else 0
    if saved == len(opt.variables) > 0:  # counted, none read
        return
    build_in_scope(opt, model.trainable_variables)


def build_in_scope(opt: Any, variables: list[Any]) -> None:
    """``opt.build(variables)`` in the scope of the ``tf.distribute`` strategy ``opt`` was made under.

    Under tf.distribute the optimizer's variables must be created in that
    scope (mirrored, one per replica); restart() and the runner usually run
    outside it.
    """
    strategy = internals.optimizer_strategy(opt)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        opt.build(variables)
