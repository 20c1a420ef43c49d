"""The objects and the loop state of :class:`~candle_ckpt.runner.job.JobRunner`: what each is, and its files.

* :class:`RunnerObject`: one registered Keras object (model, layer or
  optimizer) with its ``<name>.weights.h5`` and what builds it;
* :func:`loop_state_files` / :func:`restore_loop_state`: the user's ``state``
  dict as ``loop_state.json`` (JSON values, NumPy generator states, the
  epoch, and the step of a mid-epoch checkpoint), ``loop_state.npz`` (arrays)
  and ``loop_state.weights.h5`` (Keras variables and seed generators);
* :func:`capture_runner` / :func:`restore_runner`: a whole runner checkpoint;
* :func:`parse_stop_conditions`: the runner's epoch limits and callables.

What a checkpoint holds (one directory ``epochs/NNN``, every file CRC-checked):

* ``<name>.weights.h5`` for each entry of ``objects`` (one standard Keras
  weights file per object, so each can also be read with ``load_weights``);
  ``objects={"model": m}`` gives ``model.weights.h5``, the callback's name;
  ``<name>.extra.npz`` holds the seed states of its random layers (Dropout),
  which the weights file omits (see ``ModelState.extra_variables``);
* ``loop_state.json``: the completed-epoch counter and the plain values of
  ``state`` (JSON types, and ``numpy.random.Generator`` states);
* ``loop_state.npz``: the NumPy arrays and scalars of ``state``;
* ``loop_state.weights.h5``: the Keras variables of ``state``, including the
  state variable of each ``keras.random.SeedGenerator``.

Optimizers: a compiled model's optimizer is saved with the model. A
standalone optimizer must be passed with the variables it trains,
``objects={"g_opt": (g_opt, generator.trainable_variables)}``: the runner
builds it on those variables before saving epoch 0 and before restoring
(Keras creates optimizer slots lazily; restoring into an unbuilt optimizer
would silently skip them). An optimizer passed alone must already be built.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import h5py
import keras
import numpy as np

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import NoValidCheckpoint
from candle_ckpt.engine.capture import Capture
from candle_ckpt.keras.preflight import build_in_scope
from candle_ckpt.keras.state import KERAS_VERSION, HostSnapshot, ModelState, backend_name, to_host
from candle_ckpt.storage.store import FileSpec

STATE_JSON = "loop_state.json"
STATE_NPZ = "loop_state.npz"
STATE_H5 = "loop_state.weights.h5"
STATE_FILES = (STATE_JSON, STATE_NPZ, STATE_H5)


class RunnerObject:
    """One registered Keras object: its file, its state, and what builds it."""

    def __init__(self, name: str, value: Any) -> None:
        if not isinstance(name, str) or not L.is_safe_filename(name + ".weights.h5") or name == "loop_state":
            raise ValueError(
                f"objects: name {name!r} must be a plain file-name stem (letters, digits, '.', '_', '-'; "
                "not 'loop_state')"
            )
        var_list = None
        if isinstance(value, tuple):
            if len(value) != 2 or not isinstance(value[0], keras.optimizers.Optimizer):
                raise TypeError(f"objects[{name!r}]: a tuple must be (optimizer, variables it trains)")
            value, var_list = value[0], list(value[1])
        if not hasattr(value, "save_own_variables") and not isinstance(value, keras.Model):
            raise TypeError(
                f"objects[{name!r}] must be a Keras model, layer or optimizer (a KerasSaveable); "
                f"got {type(value).__name__}"
            )
        self.name = name
        self.file = name + ".weights.h5"
        self.extra_file = name + ".extra.npz"  # seed states save_weights omits (Dropout layers...)
        self.obj = value
        self.var_list = var_list
        self.state = ModelState(value)

    def ensure_built(self) -> None:
        opt = self.obj
        if not isinstance(opt, keras.optimizers.Optimizer) or opt.built:
            return
        if self.var_list is None:
            raise ValueError(
                f"objects[{self.name!r}]: the optimizer is not built. Pass it as objects={{{self.name!r}: "
                "(optimizer, model.trainable_variables)} so the runner can build it before saving and restoring."
            )
        build_in_scope(opt, self.var_list)


def state_kind(key: str, value: Any) -> str:
    """Classify one loop-state value: keras, rng, array or json."""
    if isinstance(value, (keras.random.SeedGenerator, keras.Variable)):
        return "keras"
    if isinstance(value, np.random.Generator):
        return "rng"
    if isinstance(value, (np.ndarray, np.generic)):
        return "array"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = None
    if text is None or json.loads(text) != value:
        raise TypeError(
            f"state[{key!r}]: {type(value).__name__} cannot be saved exactly; use JSON types (int, float, str, bool, "
            "None, list, dict with str keys), NumPy arrays/scalars, numpy.random.Generator, keras.Variable or "
            "keras.random.SeedGenerator (a tuple must be a list)"
        )
    return "json"


def state_variable(value: Any) -> keras.Variable:
    return value.state if isinstance(value, keras.random.SeedGenerator) else value


def loop_state_files(
    state: Mapping[str, Any], kinds: Mapping[str, str], epoch: int, step: int | None
) -> list[FileSpec]:
    """The loop-state files of a save; ``step``: the steps done in epoch ``epoch`` of a mid-epoch save."""
    doc: dict[str, Any] = {"epoch": epoch, "values": {}, "numpy_rngs": {}, "arrays": [], "keras": []}
    if step is not None:
        doc["step"] = step
    arrays: dict[str, np.ndarray] = {}
    keras_entries = []
    for key, value in state.items():
        kind = kinds.get(key) or state_kind(key, value)
        if kind == "keras":
            keras_entries.append((f"loop_state/{key}", {"name": key}, [("0", to_host(state_variable(value)))]))
            doc["keras"].append(key)
        elif kind == "rng":
            doc["numpy_rngs"][key] = value.bit_generator.state
        elif kind == "array":
            arrays[key] = np.array(value, copy=True)
            doc["arrays"].append(key)
        else:
            doc["values"][key] = value
    text = json.dumps(doc, sort_keys=True).encode()  # taken now: the loop may change state next
    files = [FileSpec(STATE_JSON, lambda f: f.write(text))]
    if arrays:
        files.append(FileSpec(STATE_NPZ, lambda f: np.savez(f, **arrays)))
    if keras_entries:
        files.append(FileSpec(STATE_H5, HostSnapshot(keras_entries).write_h5))
    return files


def read_loop_state(state: Mapping[str, Any], contents: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The saved loop state's description, checked against ``state`` before anything is loaded.

    Raises:
        NoValidCheckpoint: the checkpoint lacks a key of ``state``.
    """
    doc = json.loads(contents[STATE_JSON])
    for key in state:
        if not any(key in doc[k] for k in ("values", "numpy_rngs", "arrays", "keras")):
            raise NoValidCheckpoint(f"checkpoint {where} has no loop state {key!r} (it has {sorted(doc['values'])})")
    return doc


def apply_loop_state(state: MutableMapping[str, Any], doc: Mapping[str, Any], contents: Mapping[str, Any]) -> None:
    """Put the loop state of :func:`read_loop_state` back into ``state``, in place."""
    for key, value in doc["values"].items():
        state[key] = value
    for key, rng_state in doc["numpy_rngs"].items():
        state[key].bit_generator.state = rng_state
    if doc["arrays"]:
        with np.load(io.BytesIO(contents[STATE_NPZ]), allow_pickle=False) as npz:
            for key in doc["arrays"]:
                arr = npz[key]
                state[key] = arr[()] if arr.ndim == 0 and isinstance(state.get(key), np.generic) else arr
    if doc["keras"]:
        with h5py.File(io.BytesIO(contents[STATE_H5]), "r") as h5:
            for key in doc["keras"]:
                state_variable(state[key]).assign(h5[f"loop_state/{key}/vars/0"][()])


def parse_stop_conditions(given: Any, epochs: int | None) -> tuple[list[int], list[Callable]]:
    """Split ``stop_conditions`` into epoch limits and callables (default: ``epochs``), checked."""
    if given is None:
        given = [] if epochs is None else [epochs]
    elif isinstance(given, int) or callable(given):
        given = [given]
    limits, conditions = [], []
    for cond in given:
        if isinstance(cond, bool) or not (isinstance(cond, int) or callable(cond)):
            raise TypeError(f"stop_conditions: {cond!r} is neither an epoch limit (int) nor a callable")
        if callable(cond):
            conditions.append(cond)
        elif cond < 0:
            raise ValueError(f"stop_conditions: epoch limit must be >= 0; got {cond}")
        else:
            limits.append(cond)
    if not limits and not conditions:
        raise ValueError("JobRunner needs a stop condition: gParameters['epochs'] or stop_conditions=[N or fn]")
    return limits, conditions


def capture_runner(
    objects: list[RunnerObject], state: Mapping[str, Any], kinds: Mapping[str, str], epoch: int, step: int | None
) -> Capture:
    """Snapshot every object and the loop state (at ``epoch``, and ``step`` of a mid-epoch checkpoint)."""
    start = time.perf_counter()
    files: list[FileSpec] = []
    nbytes, inline_why = 0, None
    for o in objects:
        o.ensure_built()
        snap = o.state.snapshot()
        nbytes += snap.nbytes
        inline_why = inline_why or snap.inline_why  # a copy that did not fit: written before training goes on
        files.append(FileSpec(o.file, snap.write_h5))
        if snap.extra:
            files.append(FileSpec(o.extra_file, snap.write_extra))
    files += loop_state_files(state, kinds, epoch, step)
    return Capture(
        files=files,
        model_file=objects[0].file,
        nbytes=nbytes,
        snapshot_s=time.perf_counter() - start,
        keras_version=KERAS_VERSION,
        backend=backend_name(),
        extra={"runner": {"objects": {o.name: o.file for o in objects}, "state": sorted(state)}},
        inline_why=inline_why,
    )


def restore_runner(
    objects: list[RunnerObject], state: MutableMapping[str, Any], chosen: Any, log: Any, where: str
) -> tuple[int, int] | None:
    """Load a verified runner checkpoint, all keys checked first; return (epoch, step) of a mid-epoch one."""
    side, contents = chosen.sidecar, chosen.contents
    missing = [o.file for o in objects if o.file not in contents] + ([STATE_JSON] if STATE_JSON not in contents else [])
    if missing:
        raise NoValidCheckpoint(
            f"checkpoint {where} has no {', '.join(missing)} (it holds {', '.join(sorted(side.files))}); "
            "was it written by a JobRunner with the same objects?"
        )
    doc = read_loop_state(state, contents, where)  # checks every key before anything is loaded
    for o in objects:
        o.ensure_built()
        o.state.restore(contents[o.file])
        if o.extra_file in contents:
            o.state.restore_extra(contents[o.extra_file])
        elif not isinstance(o.obj, keras.optimizers.Optimizer) and o.state.extra_variables():
            log.warning(
                f"restart: {where} has no {o.extra_file}; the seed states of {o.name!r} start fresh, "
                "so the resumed run will not be bit-identical"
            )
    apply_loop_state(state, doc, contents)
    return (doc["epoch"], doc["step"]) if "step" in doc else None
