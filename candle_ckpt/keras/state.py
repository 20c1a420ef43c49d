"""The only module that knows how Keras keeps state.

It relies on two private pieces of ``keras.src.saving.saving_lib`` (pinned in
``setup.cfg``; ``tests/integration/test_keras_format.py`` fails loudly if they
change):

* ``_save_state`` walks a model the way ``model.save_weights`` does. We hand it
  a recording store, so we learn which variables go to which H5 path without
  writing anything. That "plan" lets us take a host snapshot (one copy of each
  variable) and later write a standard ``.weights.h5`` from the snapshot on any
  thread, while training goes on.
* ``_load_state`` with ``H5IOStore`` reads a ``.weights.h5``. We feed it the
  bytes that were just CRC-verified, so a restart reads each file once.

Trap handled here: a freshly compiled model has no optimizer variables until
its first step, and stock ``load_weights`` then silently skips the optimizer
state. :func:`build_optimizer` builds it first.
"""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass, field
from typing import Any

import h5py
import keras
import numpy as np
from keras.src.saving import saving_lib

from candle_ckpt.core.checksum import CrcFile

KERAS_VERSION = keras.__version__


@dataclass
class Entry:
    """One H5 group: its path, its attributes and its ``(key, value)`` pairs."""

    path: str
    metadata: dict[str, Any]
    items: list[tuple[str, Any]] = field(default_factory=list)
    # True when save_own_variables handed us copies we could not map back to
    # variables: such a plan must be re-walked for every snapshot.
    volatile: bool = False


class _PlanStore(saving_lib.H5IOStore):
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


def _optimizers(obj: Any) -> list[Any]:
    """The optimizers reachable from ``obj`` (a model's, wrapped ones, or ``obj`` itself)."""
    found: list[Any] = []
    opt = obj if isinstance(obj, keras.optimizers.Optimizer) else getattr(obj, "optimizer", None)
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
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    patched = [
        o
        for o in optimizers
        if type(o).save_own_variables is BaseOptimizer.save_own_variables and "save_own_variables" not in vars(o)
    ]
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
    known = _optimizers(obj) + list(extra_optimizers)
    skip = set() if optimizers else {id(o) for o in _optimizers(obj)}
    with _variables_not_copies(known if optimizers else []):
        saving_lib._save_state(obj, weights_store=store, assets_store=None, inner_path="", visited_saveables=skip)
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
        return np.asarray(keras.ops.convert_to_numpy(inner)), None
    if isinstance(value, np.ndarray):
        return value, None
    return np.asarray(keras.ops.convert_to_numpy(value)), None


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


def _to_host(value: Any) -> np.ndarray:
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

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for _, _, items in self.entries for _, a in items) + sum(a.nbytes for _, a in self.extra)

    def write_extra(self, f: CrcFile | str) -> None:
        """Write the variables ``save_weights`` omits as an ``.npz`` (paths + values)."""
        arrays = {f"v{i}": value for i, (_, value) in enumerate(self.extra)}
        np.savez(f, paths=np.array([path for path, _ in self.extra], dtype=str), **arrays)

    def arrays(self) -> list[np.ndarray]:
        return [a for _, _, items in self.entries for _, a in items]

    def write_h5(self, f: CrcFile | str) -> None:
        """Write a standard Keras ``.weights.h5`` (same groups, attrs and datasets)."""
        try:
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
        opt = getattr(self.model, "optimizer", None)
        return len(self.model.variables), len(opt.variables) if opt is not None else 0

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
        if not self.model.built:
            raise ValueError("the model is not built yet; build it (call it on data or model.build()) before saving")
        plan = self.plan()
        # Tiny (a few ints per random layer): always an owned copy.
        extra = [(v.path, _to_host(v)) for v in self.extra_variables(plan)]
        keepalive: list[Any] = []
        entries = []
        for e in plan:
            items = []
            for k, v in e.items:
                view, owner = _host_view(v)
                if owner is not None:
                    keepalive.append(owner)
                items.append((k, view))
            entries.append((e.path, e.metadata, items))
        if not copy:
            return HostSnapshot(entries, extra, keepalive)
        spare = self._spare if self._spare is not None and not self._spare.busy else None
        old = spare.arrays() if spare is not None else []
        self._spare = None  # a busy spare is dropped, never written over
        copied, i = [], 0
        for path, metadata, items in entries:
            out = []
            for k, view in items:
                dst = old[i] if i < len(old) and old[i].shape == view.shape and old[i].dtype == view.dtype else None
                if dst is None:
                    dst = np.empty(view.shape, view.dtype)
                np.copyto(dst, view)
                out.append((k, dst))
                i += 1
            copied.append((path, metadata, out))
        del keepalive, entries  # the views (and TF's copy-on-write hold) go now
        snap = HostSnapshot(copied, extra, busy=True)
        self._spare = snap
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
        return saving_lib._serialize_model_as_json(self.model)

    def restore(self, weights: bytes) -> None:
        """Load a ``.weights.h5`` held in memory into the model, optimizer included.

        Raises:
            ValueError: if the checkpoint does not match the model.
        """
        build_optimizer(self.model)
        load_weights_bytes(self.model, weights)

    def restore_extra(self, data: bytes) -> None:
        """Load the ``model.extra.npz`` written by :meth:`HostSnapshot.write_extra`.

        Raises:
            ValueError: if its variables do not match the model's.
        """
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            paths = [str(p) for p in npz["paths"]]
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


def build_optimizer(model: keras.Model) -> None:
    """Create the optimizer's variables so that its state can be loaded."""
    if not model.built:
        raise ValueError(
            "restart() needs a built model: build it (call it on data, model.build(), or use an Input layer) first"
        )
    opt = getattr(model, "optimizer", None)
    if opt is not None and not opt.built:
        build_in_scope(opt, model.trainable_variables)


def build_in_scope(opt: Any, variables: list[Any]) -> None:
    """``opt.build(variables)`` in the scope of the ``tf.distribute`` strategy ``opt`` was made under.

    Under tf.distribute the optimizer's variables must be created in that
    scope (mirrored, one per replica); restart() and the runner usually run
    outside it.
    """
    strategy = getattr(opt, "_distribution_strategy", None)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        opt.build(variables)


class _BufferFile(io.BytesIO):
    """A read-only, seekable file over any buffer (bytes, mmap), without copying it.

    ``io.BytesIO(data)`` copies anything but ``bytes`` whole; here h5py's
    ``readinto`` copies each byte once, straight into its destination. It
    subclasses ``BytesIO`` (left empty) because Keras's ``H5IOStore`` accepts
    only that type.
    """

    def __init__(self, data) -> None:
        super().__init__()
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf) -> int:
        dst = memoryview(buf).cast("B")
        n = max(0, min(len(dst), len(self._view) - self._pos))
        dst[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        data = self._view[self._pos : end].tobytes() if end > self._pos else b""
        self._pos += len(data)
        return data

    def write(self, data) -> int:
        raise io.UnsupportedOperation("read-only")

    def close(self) -> None:
        if not self.closed:
            self._view.release()  # so that an mmap behind it can be closed
        super().close()


def load_weights_bytes(obj: Any, weights, *, objects_to_skip=()) -> None:
    """Load a ``.weights.h5`` held in memory (bytes, mmap or any buffer) into ``obj``.

    Uses Keras's own loader, strictly: a missing or mismatched variable raises.
    """
    source = _BufferFile(weights)
    try:
        _load_weights_from(obj, source, objects_to_skip)
    finally:
        source.close()


class _ReadStore(saving_lib.H5IOStore):
    """Keras's reading store, minus one copy per array.

    ``H5IOStore.__getitem__`` returns ``np.array(dataset)``: h5py reads into
    a zero-filled array and numpy copies it again. Here each dataset is read
    once, into uninitialised memory, after the same safety checks
    (``safe_get_h5_dataset``: no external or virtual datasets, no shape bombs).
    """

    def __getitem__(self, key):
        dataset = saving_lib.safe_get_h5_dataset(self._h5_entry_group, key)
        if not dataset.shape or dataset.size == 0 or "dtype" in dataset.attrs:  # scalars, bfloat16: Keras's way
            return super().__getitem__(key)
        out = np.empty(dataset.shape, dataset.dtype)
        dataset.read_direct(out)
        return out


def _load_weights_from(obj: Any, source: io.BytesIO, objects_to_skip) -> None:
    store = _ReadStore(source, mode="r")
    failed: set[int] = set()
    errors: dict[int, Any] = {}
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Skipping variable loading")
            saving_lib._load_state(
                obj,
                weights_store=store,
                assets_store=None,
                inner_path="",
                visited_saveables={id(o) for o in objects_to_skip},
                failed_saveables=failed,
                error_msgs=errors,
            )
    finally:
        store.close()
    if failed:
        saving_lib._raise_loading_failure(errors)


def backend_name() -> str:
    return keras.backend.backend()
