"""The model's state as host arrays: the snapshot an epoch end takes, and its writing.

:class:`ModelState` walks the save plan (:mod:`candle_ckpt.keras.plan`) to take
a host snapshot of every variable (a view where the backend allows, a copy
into reused buffers for async saves) and writes a standard ``.weights.h5``
from it; restore goes through :mod:`candle_ckpt.keras.h5read`. The ``.keras``
archive's config comes from Keras's private ``_serialize_model_as_json``
(through :mod:`candle_ckpt.keras.internals`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import h5py
import keras
import numpy as np

from candle_ckpt.core.checksum import CrcFile
from candle_ckpt.engine.writer import copy_refused
from candle_ckpt.keras import internals
from candle_ckpt.keras.h5read import load_weights_bytes
from candle_ckpt.keras.plan import Entry, is_built, make_plan, optimizers_of
from candle_ckpt.keras.preflight import build_optimizer

KERAS_VERSION = internals.KERAS_VERSION


def _host_view(value: Any) -> tuple[np.ndarray, Any]:
    """The current value of a variable as a host array, copied only where the backend must.

    Returns the array and the object that keeps its memory valid. On
    TensorFlow, ``ReadVariableOp`` aliases the variable's buffer (an assign
    that follows copies on write), and ``np.asarray`` of a CPU tensor is a
    view: so this costs no copy on CPU, and one device-to-host copy on GPU.

    On JAX, ``np.asarray`` of a CPU array is a read-only view of its buffer,
    and on torch ``detach().numpy()`` of a CPU tensor shares its memory (an
    optimizer step updates it in place). Keras's ``convert_to_numpy`` copies
    on both; these views do not. A view must not outlive the train step (the
    JAX trainer donates its state buffers; torch writes in place): the async
    path copies it at once (:meth:`ModelState.snapshot`), the sync path writes
    it before training resumes.
    """
    if isinstance(value, keras.Variable):
        inner = value.value
        read = getattr(inner, "read_value", None)
        if read is not None:
            tensor = read()
            view = np.asarray(tensor)
            view.flags.writeable = False  # it may alias the live variable
            return view, tensor
        view = _backend_view(inner)
        if view is not None:
            return view, inner
        return np.asarray(keras.ops.convert_to_numpy(inner)), OWNED
    if isinstance(value, np.ndarray):
        return value, None
    return np.asarray(keras.ops.convert_to_numpy(value)), None


#: The owner ``_host_view`` gives a fresh host copy (an accelerator's value): nothing aliases it, so an
#: async snapshot takes it as it is instead of copying it a second time.
OWNED = object()


def _accelerator_values(variables: list[Any]) -> list[tuple[Any, Any]]:
    """``(variable, value)`` of each JAX variable whose value lives on an accelerator (not the CPU)."""
    if keras.backend.backend() != "jax":
        return []
    out = []
    for var in variables:
        inner = getattr(var, "value", None)
        devices = getattr(inner, "devices", None)
        if devices is not None and any(d.platform != "cpu" for d in devices()):
            out.append((var, inner))
    return out


def to_pinned_host(variables: list[Any]) -> dict[int, Any]:
    """``{id(variable): host array}`` of every JAX accelerator value, all copied at once into pinned host memory.

    One ``jax.device_put`` to the ``pinned_host`` memory kind moves every value in one go at the
    link's speed (an H200: 256 MiB in ~6 ms), where ``np.asarray`` of each value in turn waits for
    one pageable transfer after another (~90 ms). The copies are complete when this returns (the
    next train step may donate the values' buffers). The results are JAX arrays in host memory:
    :meth:`HostSnapshot.materialize` turns them into NumPy arrays on the writer's thread. Where the
    platform has no pinned host memory the values are only prefetched (their transfers started at
    once) and ``{}`` is returned: the caller reads them one by one.
    """
    found = _accelerator_values(variables)
    if not found:
        return {}
    import jax  # noqa: PLC0415 (only reached with JAX accelerator values)

    values = [inner for _, inner in found]
    try:
        host = jax.device_put(values, [v.sharding.with_memory_kind("pinned_host") for v in values])
        jax.block_until_ready(host)
        np.asarray(min(host, key=lambda h: h.size))  # readable as NumPy here (the writer reads them all so)
    except (ValueError, TypeError, NotImplementedError, RuntimeError):  # no pinned_host memory space here
        for inner in values:
            inner.copy_to_host_async()
        return {}
    return {id(var): h for (var, _), h in zip(found, host, strict=True)}


def _backend_view(inner: Any) -> np.ndarray | None:
    """A no-copy, read-only host view of a JAX or torch CPU value; None where one cannot be had."""
    backend = keras.backend.backend()
    if backend == "jax":
        devices = getattr(inner, "devices", None)
        if devices is None or any(d.platform != "cpu" for d in devices()) or str(inner.dtype) == "bfloat16":
            return None
        view = np.asarray(inner)
    elif backend == "torch":
        if inner.device.type != "cpu" or str(inner.dtype) == "torch.bfloat16":
            return None
        view = inner.detach().numpy()
    else:
        return None
    view.flags.writeable = False  # it aliases the live variable
    return view


def to_host(value: Any) -> np.ndarray:
    """An owned host copy of a variable or array (safe to keep while training goes on)."""
    return np.array(_host_view(value)[0], copy=True)


@dataclass
class HostSnapshot:
    """Weights and optimizer state in host memory, ready to be written.

    A *copied* snapshot owns its arrays (the async path: training may go on
    while it is written). A *view* snapshot aliases the variables (the sync
    path: it is written before training resumes, so no copy is needed).
    """

    entries: list[tuple[str, dict[str, Any], list[tuple[str, np.ndarray]]]]
    # Model variables that save_weights leaves out (the SeedGenerator state of
    # Dropout and other random layers), as (variable.path, owned copy).
    extra: list[tuple[str, np.ndarray]] = field(default_factory=list)
    keepalive: list[Any] = field(default_factory=list)
    # True from the copy until write_h5 is done with the arrays; ModelState
    # reuses the buffers of a snapshot that is no longer busy.
    busy: bool = False
    # Why a copy was asked for and not taken (it would not fit in host memory): this view snapshot must be
    # written before training goes on (Capture.inline_why).
    inline_why: str | None = None

    def materialize(self) -> None:
        """Turn the JAX host arrays of an accelerator snapshot (:func:`to_pinned_host`) into NumPy arrays.

        Called where the arrays are used, so that an async save does it on the writer's thread.
        """
        for i, (path, metadata, items) in enumerate(self.entries):
            if any(not isinstance(a, np.ndarray) for _, a in items):
                self.entries[i] = (path, metadata, [(k, np.asarray(a)) for k, a in items])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for _, _, items in self.entries for _, a in items) + sum(a.nbytes for _, a in self.extra)

    def write_extra(self, f: CrcFile | str) -> None:
        """Write the variables ``save_weights`` omits as an ``.npz`` (paths + values)."""
        arrays = {f"v{i}": value for i, (_, value) in enumerate(self.extra)}
        np.savez(f, paths=np.array([path for path, _ in self.extra], dtype=str), **arrays)

    def arrays(self) -> list[np.ndarray]:
        self.materialize()
        return [a for _, _, items in self.entries for _, a in items]

    def write_h5(self, f: CrcFile | str) -> None:
        """Write a standard Keras ``.weights.h5`` (same groups, attrs and datasets)."""
        try:
            self.materialize()
            with h5py.File(f, "w") as h5:
                for path, metadata, items in self.entries:
                    group = h5.create_group("vars") if not path else h5.create_group(path).create_group("vars")
                    for k, v in metadata.items():
                        group.attrs[k] = v
                    for key, array in items:
                        if keras.backend.standardize_dtype(array.dtype) == "bfloat16":
                            ds = group.create_dataset(key, data=array)
                            ds.attrs["dtype"] = "bfloat16"
                        else:
                            group[key] = array
        finally:
            self.busy = False
            self.keepalive.clear()


def _copied(entries: list, owned: set[int], spare: HostSnapshot | None) -> list:
    """``entries`` with each view copied into a host buffer: the spare's where its shape and dtype match, a new one
    otherwise. A view already a copy of its own (its id in ``owned``) is taken as it is, its spare buffer unused."""
    old = spare.arrays() if spare is not None else []
    copied, i = [], 0
    for path, metadata, items in entries:
        out = []
        for k, view in items:
            if id(view) not in owned:
                dst = old[i] if i < len(old) and old[i].shape == view.shape and old[i].dtype == view.dtype else None
                if dst is None:
                    dst = np.empty(view.shape, view.dtype)
                np.copyto(dst, view)
                view = dst
            out.append((k, view))
            i += 1
        copied.append((path, metadata, out))
    return copied


class ModelState:
    """Snapshot / restore for one Keras model (weights and optimizer).

    The save plan is computed once and reused while the set of variables is
    unchanged, so a snapshot costs one copy of each variable and nothing more.
    """

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self._plan: list[Entry] | None = None
        self._plan_key: tuple[int, int] | None = None
        self._spare: HostSnapshot | None = None

    def _variable_count(self) -> tuple[int, int]:
        return len(self.model.variables), sum(len(opt.variables) for opt in optimizers_of(self.model))

    def plan(self) -> list[Entry]:
        key = self._variable_count()
        if self._plan is None or key != self._plan_key or any(e.volatile for e in self._plan):
            self._plan = make_plan(self.model)
            self._plan_key = key
        return self._plan

    def snapshot(self, copy: bool = True) -> HostSnapshot:
        """Take the model's state on the calling thread.

        Args:
            copy: Copy into host buffers that the snapshot owns, so training
                may go on while it is written (async). The buffers of the
                previous snapshot are reused once it has been written, so
                after the first save a snapshot is one memcpy, with no page
                faults, and at most one copy of the state exists. With
                ``copy=False`` the arrays alias the variables (no copy): write
                them before the next training step (sync).
        """
        if not is_built(self.model):
            raise ValueError("the model is not built yet; build it (call it on data or model.build()) before saving")
        plan = self.plan()
        # Tiny (a few ints per random layer): always an owned copy.
        extra = [(v.path, to_host(v)) for v in self.extra_variables(plan)]
        keepalive: list[Any] = []
        entries = []
        pinned = to_pinned_host([v for e in plan for _, v in e.items])
        owned: set[int] = set()  # ids of fresh host copies (no view of a live variable)
        for e in plan:
            items = []
            for k, v in e.items:
                if id(v) in pinned:
                    view, owner = pinned[id(v)], OWNED
                else:
                    view, owner = _host_view(v)
                if owner is OWNED:
                    owned.add(id(view))
                elif owner is not None:
                    keepalive.append(owner)
                items.append((k, view))
            entries.append((e.path, e.metadata, items))
        if not copy:
            return HostSnapshot(entries, extra, keepalive)
        spare = self._spare if self._spare is not None and not self._spare.busy else None
        if spare is None:  # new buffers: do they fit beside training?
            need = sum(view.nbytes for _, _, items in entries for _, view in items if id(view) not in owned)
            refused = copy_refused(need)
            if refused is not None:  # written from the variables, before training goes on (the engine does so)
                return HostSnapshot(entries, extra, keepalive, inline_why=refused)
        self._spare = None  # a busy spare is dropped, never written over
        copied = _copied(entries, owned, spare)
        del keepalive, entries  # the views (and TF's copy-on-write hold) go now
        snap = self._spare = HostSnapshot(copied, extra, busy=True)
        return snap

    def extra_variables(self, plan: list[Entry] | None = None) -> list[Any]:
        """Model variables that the weights file does not hold (RNG seed states).

        ``model.save_weights`` leaves out the state of each layer's
        ``SeedGenerator`` (Dropout and other random layers); without it a
        resumed run draws the same dropout masks again and is not
        bit-identical. These go to a separate ``model.extra.npz``.
        """
        if plan is None:  # restart: the layers' plan is enough (optimizer variables are not model variables)
            plan = self.plan() if self._plan is not None else make_plan(self.model, optimizers=False)
        planned = {id(v) for e in plan for _, v in e.items}
        return [v for v in self.model.variables if id(v) not in planned]

    def full_model_parts(self) -> tuple[str, str]:
        """Return (config.json, metadata.json) of the ``.keras`` archive."""
        return internals.serialize_model_as_json(self.model)

    def restore(self, weights: bytes, skip: list[Any] | None = None) -> None:
        """Load a ``.weights.h5`` held in memory into the model, optimizer included (not the objects in ``skip``).

        Raises:
            ValueError: if the checkpoint does not match the model.
        """
        build_optimizer(self.model, weights)
        load_weights_bytes(self.model, weights, objects_to_skip=skip or ())

    def restore_extra(self, data: bytes, variables: list[Any] | None = None) -> None:
        """Load the ``model.extra.npz`` written by :meth:`HostSnapshot.write_extra`.

        Raises:
            ValueError: if its variables do not match the model's.
        """
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            paths = [str(p) for p in npz["paths"]]
            if variables is None:
                variables = self.extra_variables()
            # Matched by position: Keras auto-numbers these paths
            # (seed_generator_1, _2, ...), so names differ between two
            # instances of the same model; the order of model.variables does not.
            if len(paths) != len(variables):
                raise ValueError(
                    f"model.extra.npz holds {len(paths)} variables {paths} but the model has "
                    f"{len(variables)}: {[v.path for v in variables]}"
                )
            for i, var in enumerate(variables):
                value = npz[f"v{i}"]
                if tuple(value.shape) != tuple(var.shape):
                    raise ValueError(
                        f"{var.path}: checkpoint shape {value.shape} (saved as {paths[i]}) != model shape "
                        f"{tuple(var.shape)}"
                    )
                var.assign(value)


def backend_name() -> str:
    return keras.backend.backend()
