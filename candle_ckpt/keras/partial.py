"""``load_weights``: load only some layers' weights from a checkpoint.

For evaluation, transfer learning or a warm start: the checkpoint's files are
CRC-verified first (the bytes read for the check are the bytes loaded), then
the named layers are read from the ``.weights.h5`` (or the weights member of
``model.keras``) with h5py. The model's layers
are found through its save plan (:func:`~candle_ckpt.keras.plan.make_plan`,
so nested models work) and matched to the checkpoint's H5 groups by the
``name`` attribute Keras stores on each group (by H5 path for files without
names). Every selected layer is checked (present in the
checkpoint, same variable count and shapes) before any variable is assigned:
a failed call changes nothing.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import h5py
import keras
import numpy as np

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import ModelMismatch
from candle_ckpt.core.log import OpsLog, transfer_record
from candle_ckpt.keras import internals
from candle_ckpt.keras.adapter import weights_view
from candle_ckpt.keras.plan import is_built, make_plan
from candle_ckpt.storage.store import CheckpointStore


def _locate(checkpoint: str | os.PathLike[str] | int, directory: str | os.PathLike[str] | None) -> tuple[str, int]:
    """Return ``(ckpt_directory, epoch)`` for an ``epochs/NNN`` path or an epoch number."""
    if isinstance(checkpoint, int) and not isinstance(checkpoint, bool):
        if directory is None:
            raise ValueError("load_weights: an epoch number needs directory= (the ckpt_directory)")
        return os.fspath(directory), checkpoint
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(
            f"load_weights: checkpoint must be a path to ckpts/epochs/NNN or an epoch number; got {checkpoint!r}"
        )
    found = L.split_epoch_path(os.fspath(checkpoint))
    if found is None:
        raise ValueError(
            f"load_weights: {checkpoint!r} is not a checkpoint directory <ckpt_directory>/ckpts/epochs/NNN"
        )
    return found


def _layers_by_name(model: keras.Model) -> dict[str, list[tuple[str, list[Any]]]]:
    """Map layer name -> [(H5 path, variables)] from the save plan (weighted layers only)."""
    found: dict[str, list[tuple[str, list[Any]]]] = {}
    for entry in make_plan(model):
        name = entry.metadata.get("name")
        if not entry.path or not entry.path.startswith("layers/") or not entry.items or name is None:
            continue
        found.setdefault(str(name), []).append((entry.path, [v for _, v in entry.items]))
    return found


def load_weights(
    model: keras.Model,
    checkpoint: str | os.PathLike[str] | int,
    layers: Iterable[str] | Callable[[keras.layers.Layer], bool],
    *,
    directory: str | os.PathLike[str] | None = None,
    file: str | None = None,
) -> dict[str, Any]:
    """Load the weights of some layers of ``model`` from a checkpoint.

    Args:
        model: A built model whose layers carry the same names as when saved.
        checkpoint: ``<ckpt_directory>/ckpts/epochs/NNN``, or an epoch number
            together with ``directory``.
        layers: Layer names, or a predicate ``fn(layer) -> bool`` over the
            model's layers (searched recursively).
        directory: The ``ckpt_directory`` when ``checkpoint`` is an epoch number.
        file: The weights file in the checkpoint (default: the sidecar's
            ``model_file``; e.g. ``"gen.weights.h5"`` for a runner object).

    Returns:
        Statistics: ``layers`` loaded, ``bytes``, ``verify_s``, ``load_s``, ``mb_per_s``.

    Raises:
        CorruptCheckpoint: a file fails its size or CRC check (nothing is loaded).
        ModelMismatch: a selected layer is missing from the checkpoint, or has another
            number or shape of variables there (naming the layer and both shapes).
        ValueError: an unknown layer name (the message lists the available ones).
    """
    root, epoch = _locate(checkpoint, directory)
    if not is_built(model):
        raise ValueError("load_weights needs a built model (call it on data, model.build(), or use an Input layer)")
    available = _layers_by_name(model)
    wanted = _select_layers(model, layers, available)

    store = CheckpointStore(root)
    start = time.perf_counter()
    side = store.read_sidecar(epoch)
    name = file or side.model_file
    if name not in side.files:
        raise ValueError(
            f"load_weights: checkpoint {store.layout.epoch_dir(epoch)} has no {name!r}; it has {sorted(side.files)}"
        )
    side, contents = store.verify(epoch, reads=[name])
    verify_s = time.perf_counter() - start

    start = time.perf_counter()
    where = store.layout.epoch_dir(epoch)
    with weights_view(contents[name], name, where) as weights, h5py.File(io.BytesIO(weights), "r") as h5:
        assignments = _checked_assignments(h5, {n: available[n] for n in wanted}, f"{name} of epoch {epoch}")
    for var, value in assignments:  # all checked: now change the model
        var.assign(value)
    load_s = time.perf_counter() - start
    nbytes = side.files[name].size
    stats = transfer_record(nbytes, {"epoch": epoch, "file": name, "layers": wanted}, verify_s=verify_s, load_s=load_s)
    OpsLog(store.layout.log).info(
        f"load_weights: {len(wanted)} layer(s) {wanted} from {store.layout.epoch_dir(epoch)}/{name}: "
        f"{nbytes / 1e6:.1f} MB verified in {verify_s:.3f} s, loaded in {load_s:.3f} s ({stats['mb_per_s']:.1f} MB/s)"
    )
    return stats


def _select_layers(
    model: keras.Model,
    layers: Iterable[str] | Callable[[keras.layers.Layer], bool],
    available: dict[str, list[tuple[str, list[Any]]]],
) -> list[str]:
    """The names of the layers to load, in order, once each; ValueError for an unknown name or none."""
    if callable(layers):
        wanted = [layer.name for layer in internals.flatten_layers(model) if layers(layer)]
        wanted = [n for n in dict.fromkeys(wanted) if n in available]
    else:
        if isinstance(layers, str):
            layers = [layers]
        wanted = list(dict.fromkeys(layers))
        unknown = [n for n in wanted if n not in available]
        if unknown:
            raise ValueError(
                f"load_weights: unknown layer name(s) {unknown}; layers with weights in this model: {sorted(available)}"
            )
    if not wanted:
        raise ValueError(f"load_weights: no layer selected; layers with weights: {sorted(available)}")
    return wanted


def _checked_assignments(
    h5: h5py.File, wanted: dict[str, list[tuple[str, list[Any]]]], source: str
) -> list[tuple[Any, np.ndarray]]:
    """Read every wanted layer's saved values, checking each layer and shape first; change nothing.

    Args:
        h5: The open ``.weights.h5``.
        wanted: Layer name -> its ``(H5 path, variables)`` in the model.
        source: The file and epoch, for the error messages.
    """
    assignments: list[tuple[Any, np.ndarray]] = []
    saved_names = {str(g.attrs.get("name")): p for p, g in _groups(h5)}
    for layer_name, entries in wanted.items():
        for path, variables in entries:
            # By the saved layer name first (a transfer target may order its layers
            # differently, so the same H5 path can be another layer), then by path.
            group = h5.get(f"{saved_names[layer_name]}/vars") if layer_name in saved_names else None
            if group is None and not saved_names:
                group = h5.get(f"{path}/vars")
            if group is None:
                raise ModelMismatch(
                    f"load_weights: layer {layer_name!r} is not in {source}; layers there: {sorted(saved_names)}"
                )
            if len(group) != len(variables):
                raise ModelMismatch(
                    f"load_weights: layer {layer_name!r} has {len(variables)} variables but the checkpoint "
                    f"has {len(group)}"
                )
            for i, var in enumerate(variables):
                data = group[str(i)]
                if tuple(data.shape) != tuple(var.shape):
                    raise ModelMismatch(
                        f"load_weights: shape mismatch for layer {layer_name!r} variable {var.path or i}: "
                        f"model {tuple(var.shape)}, checkpoint {tuple(data.shape)}"
                    )
                assignments.append((var, data[()]))
    return assignments


def _groups(h5: h5py.File):
    """Yield ``(path, group)`` of every group that holds a ``vars`` subgroup."""
    found = []

    def visit(path: str, obj) -> None:
        if isinstance(obj, h5py.Group) and "vars" in obj and isinstance(obj["vars"], h5py.Group):
            found.append((path, obj["vars"]))

    h5.visititems(visit)
    return found
