"""``candle-ckpt consolidate DIR OUT.keras``: a sharded checkpoint becomes one stock-Keras ``model.keras``.

A job of several processes saves each checkpoint as parts (see docs/format.rst,
"Sharded checkpoints"). This command leaves that format on one machine: it
verifies every file of the checkpoint, reads every array whole, builds the
model from the ``config.json`` saved beside the manifest (on the CPU, no
distribution), assigns each model and optimizer variable by its Keras
``variable.path``, and writes ``OUT.keras`` with ``model.save`` (to a temporary
name first, then renamed: a failed run leaves no partial file). The result
loads with ``keras.models.load_model`` anywhere.

Only Keras's public API is used (``keras.saving.deserialize_keras_object``,
``variable.path``, ``assign``, ``model.save``).
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from typing import Any

import numpy as np

from candle_ckpt.cli.common import EXIT_CORRUPT, EXIT_OK, CliError, open_store, resolve_epoch
from candle_ckpt.cli.console import import_keras_quietly, native_stderr_hidden
from candle_ckpt.core.dtypes import counter_fits
from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.log import counted
from candle_ckpt.storage.sharded import MANIFEST, dtype_of
from candle_ckpt.storage.shardread import consolidate

CONFIG = "config.json"


def cmd_consolidate(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    if not output.endswith(".keras"):
        raise CliError(f"OUT.keras: {args.output!r} must end in .keras (what keras.models.load_model reads)")
    if not os.path.isdir(os.path.dirname(output)):
        raise CliError(f"OUT.keras: the directory {os.path.dirname(output)} does not exist")
    store = open_store(args.dir)
    epoch = resolve_epoch(store, args.epoch)
    try:
        side, _ = store.verify(epoch)
    except CheckpointError as err:
        raise CliError(f"refusing to consolidate epoch {epoch}: {err}", code=EXIT_CORRUPT) from None
    where = store.layout.epoch_dir(epoch)
    if side.model_file != MANIFEST:
        raise CliError(
            f"{where} is not a sharded checkpoint (its model file is {side.model_file}); "
            f"{side.model_file} already loads with keras.models.load_model"
        )
    if CONFIG not in side.files:
        raise CliError(f"{where} has no {CONFIG} (the model's Keras config), so no model can be built from it")
    arrays = consolidate(where)
    with open(os.path.join(where, CONFIG), "rb") as f:
        config = json.loads(f.read().decode("utf-8"))
    model, assigned, skipped = build_and_assign(config, arrays, where)
    tmp = os.path.join(os.path.dirname(output), f".tmp-{uuid.uuid4().hex[:8]}-{os.path.basename(output)}")
    try:
        with native_stderr_hidden():  # on JAX, Keras's serialization imports TensorFlow here
            model.save(tmp)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"wrote {output}: {counted(assigned, 'variable')} from {where} ({counted(len(side.files), 'file')} verified)")
    if skipped:
        print(f"not in the model, left out: {', '.join(skipped)}")
    return EXIT_OK


def build_and_assign(config: dict, arrays: dict[str, np.ndarray], where: str) -> tuple[Any, int, list[str]]:
    """The model of ``config`` with every variable set from ``arrays`` by path; ``(model, count, unused paths)``."""
    keras = import_keras_quietly()
    model = keras.saving.deserialize_keras_object(config) if isinstance(config, dict) and config else None
    if not isinstance(model, keras.Model):
        raise CliError(f"{where}/{CONFIG} does not describe a Keras model")
    if not model.built:
        raise CliError(f"{where}/{CONFIG}: the model cannot be built from its config (it has no build_config)")
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and any(p.startswith(f"{optimizer.name}/") for p in arrays):
        optimizer.build(model.trainable_variables)
        variables += list(optimizer.variables)
    prefix = f"{optimizer.name}/" if optimizer is not None else None
    try:
        found = match_paths([v.path for v in variables], set(arrays), prefix)
    except ValueError as err:
        raise CliError(f"{where}: {err}") from None
    for v in variables:
        value = arrays[found[v.path]] if v.path in found else None
        if value is None:  # a seed generator named after a global counter; its state is not a weight
            continue
        want = dtype_of(keras.backend.standardize_dtype(v.dtype))
        fits = counter_fits(value.dtype.name, want.name, value.size, lambda value=value: value)
        if tuple(value.shape) != tuple(v.shape) or not fits:  # Adam's iteration: int32 under JAX, int64 under TF
            raise CliError(
                f"{where}: {found[v.path]} is {value.dtype}{list(value.shape)} in the checkpoint but "
                f"{v.dtype}{list(v.shape)} in the model"
            )
        v.assign(value if value.dtype == want else value.astype(want))
    used = set(found.values())
    skipped = sorted(p for p in arrays if p not in used and not p.startswith("_"))
    return model, len(used), skipped


def match_paths(paths: list[str], saved: set[str], optimizer: str | None) -> dict[str, str]:
    """Which saved path holds each of the model's variable ``paths``.

    A model built from its config has the paths of the training script's model
    without the name scope it was built in (``dense/kernel`` for
    ``sequential/dense/kernel``), and its optimizer's variables follow
    (``adam/dense_kernel_momentum`` for ``adam/sequential_dense_kernel_momentum``).
    So a path matches itself, or else the one saved path that ends in
    ``/<path>``; an optimizer variable is renamed as its model variable was.
    Seed-generator states that match nothing are left as built.

    Raises:
        ValueError: a variable matches no saved path, or several.
    """
    found: dict[str, str] = {}
    renamed: list[tuple[str, str]] = []  # ("dense_kernel_", "sequential_dense_kernel_")
    model_paths = [p for p in paths if not (optimizer and p.startswith(optimizer))]
    for path in model_paths:
        hits = [path] if path in saved else sorted(s for s in saved if s.endswith("/" + path))
        if len(hits) > 1:
            raise ValueError(f"the model's {path} matches several saved variables: {', '.join(hits)}")
        if hits:
            found[path] = hits[0]
            renamed.append((path.replace("/", "_") + "_", hits[0].replace("/", "_") + "_"))
    for path in paths:
        if path in found or not (optimizer and path.startswith(optimizer)):
            continue
        rest = path[len(optimizer) :]
        if path in saved:
            found[path] = path
            continue
        for old, new in sorted(renamed, key=lambda pair: -len(pair[0])):
            if rest.startswith(old) and optimizer + new + rest[len(old) :] in saved:
                found[path] = optimizer + new + rest[len(old) :]
                break
    missing = [p for p in paths if p not in found and p.split("/")[-1] != "seed_generator_state"]
    if missing:
        raise ValueError(f"the checkpoint holds no value for the model's {', '.join(missing)}")
    return found
