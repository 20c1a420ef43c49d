"""Tripwires on the Keras saving internals that ``candle_ckpt.keras.internals`` reaches (plan, h5read, state).

If a Keras upgrade changes how ``save_weights`` lays out a ``.weights.h5``, or
renames the private ``saving_lib`` functions we call, these tests fail loudly
instead of checkpoints silently becoming unreadable by stock Keras.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

import inspect  # noqa: E402
import mmap  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import h5py  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from keras.src.saving import saving_lib  # noqa: E402
from keras.src.utils import module_utils  # noqa: E402

from candle_ckpt.core.checksum import CrcFile  # noqa: E402
from candle_ckpt.keras.h5read import load_weights_bytes, stored_view  # noqa: E402
from candle_ckpt.keras.plan import make_plan  # noqa: E402
from candle_ckpt.keras.state import ModelState  # noqa: E402
from candle_ckpt.storage.keras_archive import weights_member_range, write_keras_archive  # noqa: E402


def _rich_model(dtype: str | None = None) -> keras.Model:
    """Embedding -> Dense -> BatchNormalization -> Dense with Adam, after one training step."""
    keras.utils.set_random_seed(0)
    tokens = keras.Input((3,), dtype="int32")
    h = keras.layers.Embedding(10, 4, dtype=dtype)(tokens)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(8, activation="relu", dtype=dtype)(h)
    h = keras.layers.BatchNormalization(dtype=dtype)(h)
    out = keras.layers.Dense(1, dtype=dtype)(h)
    model = keras.Model(tokens, out)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, size=(16, 3)).astype("int32")
    y = rng.standard_normal((16, 1)).astype("float32")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return model


def _h5_tree(path: Path) -> dict[str, Any]:
    """Every group and dataset of an HDF5 file: attrs, and for datasets shape, dtype and bytes."""
    tree: dict[str, Any] = {}

    def attrs(obj) -> dict[str, Any]:
        return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in obj.attrs.items()}

    def visit(name: str, obj) -> None:
        if isinstance(obj, h5py.Dataset):
            value = obj[()]
            tree[name] = ("dataset", obj.shape, str(obj.dtype), attrs(obj), np.asarray(value).tobytes())
        else:
            tree[name] = ("group", attrs(obj))

    with h5py.File(path, "r") as f:
        tree["/"] = ("group", attrs(f))
        f.visititems(visit)
    return tree


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_snapshot_file_equals_keras_save_weights(tmp_path, dtype):
    """Our .weights.h5 has exactly the groups, attrs, datasets, shapes, dtypes and values of model.save_weights."""
    model = _rich_model(dtype)
    ours, theirs = tmp_path / "ours.weights.h5", tmp_path / "theirs.weights.h5"
    ModelState(model).snapshot().write_h5(str(ours))
    model.save_weights(theirs)
    got, want = _h5_tree(ours), _h5_tree(theirs)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    # The tripwire is only meaningful if the file really holds every kind of state.
    names = " ".join(want)
    assert "optimizer/vars" in names and "batch_normalization" in names and "embedding" in names
    assert want["optimizer/vars/0"][4] == np.asarray(1, dtype=want["optimizer/vars/0"][2]).tobytes()  # one step


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_snapshot_round_trips_through_our_loader(tmp_path, dtype):
    """A snapshot (float32 or bfloat16, scalars included) loads back through load_weights_bytes bit for bit."""
    model = _rich_model(dtype)
    path = tmp_path / "w.weights.h5"
    ModelState(model).snapshot().write_h5(str(path))
    other = _rich_model(dtype)
    for v in [*other.variables, *other.optimizer.variables]:
        v.assign(keras.ops.zeros(v.shape, v.dtype))
    load_weights_bytes(other, path.read_bytes())
    pairs = zip(
        [*other.variables, *other.optimizer.variables], [*model.variables, *model.optimizer.variables], strict=True
    )
    for got, want in pairs:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got.numpy(), "float32"), np.asarray(want.numpy(), "float32"))


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_async_snapshot_owns_its_arrays_while_training_goes_on(dtype):
    """A copied snapshot keeps the values of its moment through further steps, the second snapshot too
    (its buffers reused, or, for a value that reached the host as a fresh copy -- bfloat16 on JAX, any
    accelerator value -- that copy taken as it is), and it aliases no live variable."""
    model = _rich_model(dtype)
    state = ModelState(model)
    x = np.random.default_rng(1).integers(0, 10, size=(16, 3)).astype("int32")
    y = np.ones((16, 1), "float32")
    for _ in range(2):  # the second round reuses the first snapshot's buffers where it may
        before = [np.array(v.numpy()) for v in [*model.variables, *model.optimizer.variables]]
        snap = state.snapshot(copy=True)
        arrays = [a.copy() for a in snap.arrays()]
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        assert all(np.array_equal(a, b) for a, b in zip(snap.arrays(), arrays, strict=True))
        moved = [v for v, b in zip([*model.variables, *model.optimizer.variables], before, strict=True)
                 if not np.array_equal(np.asarray(v.numpy()), b)]  # fmt: skip
        assert moved, "the steps changed nothing: the check above proves nothing"
        snap.busy = False  # written: its buffers may be reused


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the pinned-host copy is JAX's (runs in the JAX pass)")
def test_pinned_host_snapshot_is_exact_and_written_as_keras_writes(tmp_path, monkeypatch):
    """The accelerator path (one device_put of every value to pinned host memory, NumPy arrays made on the
    writer's side), forced here on CPU values: the snapshot keeps its moment's values through further steps
    and its file equals model.save_weights of that moment."""
    from candle_ckpt.keras import state as state_mod  # noqa: PLC0415

    def every_value(variables):
        return [(v, v.value) for v in variables if hasattr(getattr(v, "value", None), "devices")]

    monkeypatch.setattr(state_mod, "_accelerator_values", every_value)
    model = _rich_model()
    theirs = tmp_path / "theirs.weights.h5"
    model.save_weights(theirs)
    snap = ModelState(model).snapshot(copy=True)
    assert any(not isinstance(a, np.ndarray) for _, _, items in snap.entries for _, a in items)  # the path ran
    x = np.random.default_rng(1).integers(0, 10, size=(16, 3)).astype("int32")
    model.fit(x, np.ones((16, 1), "float32"), batch_size=16, epochs=2, verbose=0)
    ours = tmp_path / "ours.weights.h5"
    snap.write_h5(str(ours))
    got, want = _h5_tree(ours), _h5_tree(theirs)
    assert sorted(got) == sorted(want) and all(got[name] == want[name] for name in want)


def test_loader_reads_arrays_in_place_and_leaves_the_mapping_free(tmp_path):
    """A save_weights file's arrays are read as views of the mapping, which still closes after the load."""
    model = _rich_model()
    path = tmp_path / "w.weights.h5"
    model.save_weights(path)
    with h5py.File(path, "r") as f, open(path, "rb") as raw:
        data = raw.read()
        arrays = []
        f.visititems(lambda _, obj: arrays.append(obj) if isinstance(obj, h5py.Dataset) and obj.shape else None)
        assert len(arrays) >= 10
        for dataset in arrays:  # the layout save_weights writes is the one read in place
            np.testing.assert_array_equal(stored_view(dataset, memoryview(data)), dataset[()])
    other = _rich_model()
    for v in [*other.variables, *other.optimizer.variables]:
        v.assign(keras.ops.zeros(v.shape, v.dtype))
    with open(path, "rb") as raw:
        mapping = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
    load_weights_bytes(other, mapping)
    mapping.close()  # BufferError if a variable still pointed into it
    for got, want in zip(other.weights, model.weights, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for got, want in zip(other.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_plan_maps_every_optimizer_entry_to_optimizer_variables():
    """make_plan maps the optimizer's saved entries back to optimizer.variables, so no entry is volatile."""
    model = _rich_model()
    plan = make_plan(model)
    assert not [e.path for e in plan if e.volatile]
    opt_entries = [e for e in plan if e.path == "optimizer"]
    assert len(opt_entries) == 1
    items = opt_entries[0].items
    assert [k for k, _ in items] == [str(i) for i in range(len(model.optimizer.variables))]
    assert all(v is var for (_, v), var in zip(items, model.optimizer.variables, strict=True))
    # Every weight, trainable or not (BatchNormalization's moving statistics), is planned exactly once.
    planned = [id(v) for e in plan for _, v in e.items]
    assert len(planned) == len(set(planned))
    assert {id(v) for v in model.weights} <= set(planned)


def test_plan_copies_no_optimizer_state(monkeypatch):
    """make_plan takes the optimizer's variables themselves: no slot is copied to host, and nothing stays patched."""
    model = _rich_model()
    opt = model.optimizer

    def refuse(self):
        raise AssertionError("make_plan copied a variable to host")

    monkeypatch.setattr(type(opt.variables[0]), "numpy", refuse)
    plan = make_plan(model)
    monkeypatch.undo()
    (entry,) = [e for e in plan if e.path == "optimizer"]
    assert all(v is var for (_, v), var in zip(entry.items, opt.variables, strict=True))
    assert "save_own_variables" not in vars(opt)


def test_plan_keeps_an_optimizers_own_save_own_variables():
    """An optimizer that saves its own way is asked for its state as before (its entry is then volatile)."""
    model = _rich_model()
    calls = []

    def own(store):
        calls.append(store)
        store["0"] = np.zeros(3)

    model.optimizer.save_own_variables = own
    plan = make_plan(model)
    assert len(calls) == 1
    assert [e.volatile for e in plan if e.path == "optimizer"] == [True]
    assert model.optimizer.save_own_variables is own


def test_restart_walks_the_model_once(tmp_path, monkeypatch):
    """restart() of a model with Dropout walks its saveables once and restores the weights and the seed state."""
    import candle_ckpt.keras.adapter as adapter
    from candle_ckpt import CandleCheckpointCallback, restart

    def dropout_model() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dropout(0.5), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse")
        return model

    params = {"ckpt_directory": str(tmp_path), "epochs": 2, "ckpt_save_best_metric": "loss"}
    trained = dropout_model()
    x = np.random.default_rng(0).standard_normal((16, 4)).astype("float32")
    cb = CandleCheckpointCallback(params, logger=None, verbose=False)
    trained.fit(x, x[:, :1], epochs=2, verbose=0, callbacks=[cb])
    fresh = dropout_model()
    fresh.build((None, 4))
    walks = []
    from candle_ckpt.keras.plan import make_plan as real

    monkeypatch.setattr(adapter, "make_plan", lambda *a, **k: walks.append(1) or real(*a, **k), raising=False)
    monkeypatch.setattr("candle_ckpt.keras.preflight.make_plan", lambda *a, **k: walks.append(1) or real(*a, **k))
    monkeypatch.setattr("candle_ckpt.keras.state.make_plan", lambda *a, **k: walks.append(1) or real(*a, **k))
    restart({**params, "ckpt_restart_mode": "required"}, fresh, logger=None, verbose=False)
    assert len(walks) == 1
    for a, b in zip(trained.variables, fresh.variables, strict=True):
        assert np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)), a.path


def test_our_loader_refuses_what_keras_refuses(tmp_path):
    """A .weights.h5 whose dataset is a soft link is refused by our loader with Keras's own message."""
    model = _rich_model()
    path = tmp_path / "w.weights.h5"
    ModelState(model).snapshot().write_h5(str(path))
    with h5py.File(path, "a") as f:
        group = f["optimizer/vars"]
        del group["1"]
        group["1"] = h5py.SoftLink("/optimizer/vars/2")
    with pytest.raises(ValueError, match="Not allowed: H5 file with SoftLink"):
        load_weights_bytes(_rich_model(), path.read_bytes())


def test_extra_variables_skip_the_optimizer_walk(monkeypatch):
    """Finding the variables save_weights omits (at restart) never asks the optimizer for its state copies."""
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dropout(0.5), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0)
    full = [v.path for v in ModelState(model).extra_variables(make_plan(model))]

    def refuse(store):
        raise AssertionError("the optimizer's save_own_variables was called")

    monkeypatch.setattr(model.optimizer, "save_own_variables", refuse)
    assert [v.path for v in ModelState(model).extra_variables()] == full
    assert full and all("seed_generator" in p for p in full)


def _parameters(func) -> list[str]:
    return list(inspect.signature(func).parameters)


def test_saving_lib_still_has_what_we_call():
    """saving_lib still has the private functions and classes the gateway calls (_save_state, the dataset checks)."""
    assert _parameters(saving_lib._save_state)[:5] == [
        "saveable",
        "weights_store",
        "assets_store",
        "inner_path",
        "visited_saveables",
    ]
    load = _parameters(saving_lib._load_state)
    assert load[:4] == ["saveable", "weights_store", "assets_store", "inner_path"]
    assert {"visited_saveables", "failed_saveables", "error_msgs"} <= set(load)
    assert _parameters(saving_lib.H5IOStore.__init__)[:2] == ["self", "path_or_io"]
    assert "mode" in _parameters(saving_lib.H5IOStore.__init__)
    for method in ("make", "get", "close", "__setitem__", "__getitem__", "keys"):
        assert callable(getattr(saving_lib.H5IOStore, method, None)), method
    assert _parameters(saving_lib._serialize_model_as_json) == ["model"]
    assert _parameters(saving_lib._raise_loading_failure)[0] == "error_msgs"
    if hasattr(saving_lib, "safe_get_h5_dataset"):  # Keras 3.14 on; 3.13 checks in the store
        assert _parameters(saving_lib.safe_get_h5_dataset) == ["group", "name"]
    else:
        assert _parameters(saving_lib.H5IOStore._verify_dataset) == ["self", "dataset"]
    config_json, metadata_json = saving_lib._serialize_model_as_json(_rich_model())
    assert isinstance(config_json, str) and isinstance(metadata_json, str)
    lazy_tf = module_utils.tensorflow  # serialize_model_as_json answers its `available` while TF is not loaded
    assert isinstance(lazy_tf, module_utils.LazyModule) and hasattr(lazy_tf, "_available")


# -- the one-write model.keras archive (candle_ckpt.storage.keras_archive) -----------------------------------------
def _write_archive(model: keras.Model, path: Path) -> None:
    """A model.keras written as a default checkpoint writes it: h5py writing the weights member in place."""
    state = ModelState(model)
    config_json, metadata_json = state.full_model_parts()
    f = CrcFile(str(path))
    write_keras_archive(f, state.snapshot(copy=False).write_h5, config_json, metadata_json)
    f.close()


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_archive_loads_with_stock_load_model_and_holds_save_weights_bytes(tmp_path, dtype):
    """Our model.keras passes zip CRC checks, loads with keras.models.load_model, and its stored weights
    member has exactly the groups, attrs and values of model.save_weights."""
    model = _rich_model(dtype)
    path = tmp_path / "model.keras"
    _write_archive(model, path)
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every member's CRC-32 is right
        assert sorted(zf.namelist()) == ["config.json", "metadata.json", "model.weights.h5"]
        assert zf.getinfo("model.weights.h5").compress_type == zipfile.ZIP_STORED
    loaded = keras.models.load_model(path)
    pairs = zip(
        [*loaded.variables, *loaded.optimizer.variables], [*model.variables, *model.optimizer.variables], strict=True
    )
    for got, want in pairs:
        np.testing.assert_array_equal(np.asarray(got.numpy(), "float32"), np.asarray(want.numpy(), "float32"))
    data = path.read_bytes()
    start, size = weights_member_range(data)
    member, theirs = tmp_path / "member.weights.h5", tmp_path / "theirs.weights.h5"
    member.write_bytes(data[start : start + size])
    model.save_weights(theirs)
    assert _h5_tree(member) == _h5_tree(theirs)


def test_weights_member_range_reads_keras_own_archives_too(tmp_path):
    """A .keras written by stock model.save (members stored) is read in place the same way."""
    model = _rich_model()
    path = tmp_path / "stock.keras"
    model.save(path)
    data = path.read_bytes()
    start, size = weights_member_range(data)
    other = _rich_model()
    for v in [*other.variables, *other.optimizer.variables]:
        v.assign(keras.ops.zeros(v.shape, v.dtype))
    load_weights_bytes(other, data[start : start + size])
    for got, want in zip(other.variables, model.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_weights_member_range_refuses_what_it_cannot_read_in_place(tmp_path):
    """Not a zip, no weights member, or a compressed one: a ValueError naming the file and the problem."""
    with pytest.raises(ValueError, match=r"x\.keras: not a \.keras archive with a model\.weights\.h5 member"):
        weights_member_range(b"not a zip at all", "x.keras")
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("config.json", "{}")
    with pytest.raises(ValueError, match=r"model\.keras: not a \.keras archive with a model\.weights\.h5 member"):
        weights_member_range(other.read_bytes())
    deflated = tmp_path / "deflated.keras"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.weights.h5", b"\0" * 1000)
    with pytest.raises(ValueError, match=r"model\.weights\.h5 is compressed; candle_ckpt writes \(and reads\) it"):
        weights_member_range(deflated.read_bytes())
