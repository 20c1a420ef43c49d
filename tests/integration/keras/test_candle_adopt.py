"""restart() adopts checkpoints that ECP-CANDLE itself wrote, in both generations' layouts.

The directories are written by ``candle_writer.py``, which follows CANDLE's
procedure and ``ckpt-info.json`` format (``model.h5``, absolute or relative
links, a decimal or ``__DISABLED__`` checksum, no ``schema_version``).
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
from candle_writer import build_model, compile_model, make_data, write_candle_dir

import candle_ckpt
from candle_ckpt import CandleCheckpointCallback, CandleCkptKeras
from candle_ckpt.core.errors import ModelMismatch
from candle_ckpt.core.fs import read_link

CANDLE_KEYS = {
    "epoch",
    "save_best_metric",
    "best_metric_last",
    "model_file",
    "checksum",
    "timestamp",
    "time_elapsed",
    "metadata",
}


def weights_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


def optimizer_equal(a, b) -> bool:
    va, vb = a.optimizer.variables, b.optimizer.variables
    return len(va) == len(vb) and all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(va, vb, strict=True))


def master_params(root: Path, epochs: int = 5) -> dict:
    return {"ckpt_directory": str(root), "epochs": epochs, "ckpt_save_best_metric": "loss"}


def test_master_checkpoints_adopted_before_compile_and_next_save_beside(tmp_path: Path) -> None:
    """A Benchmarks-master directory (model.h5, absolute links, decimal CRC) is resumed before compile():
    weights now, optimizer state at fit; CANDLE's dict comes back; our saves go beside, nothing of CANDLE's
    deleted; and the run ends bit-identical to an uninterrupted one."""
    root = tmp_path / "save"
    trained, writer = write_candle_dir(root / "ckpts", 3)
    assert os.path.isabs(os.readlink(root / "ckpts" / "last"))
    params = master_params(root)
    model = build_model(seed=9)
    found = candle_ckpt.restart(params, model, verbose=False)
    assert found == writer.bodies[3] and set(found) == CANDLE_KEYS
    assert weights_equal(model, trained)
    compile_model(model)  # after restart(), as Benchmarks master's scripts do
    x, y = make_data()
    cb = CandleCheckpointCallback(params, verbose=False)
    model.fit(x, y, batch_size=16, epochs=5, initial_epoch=found["epoch"], shuffle=False, verbose=0, callbacks=[cb])
    epochs = root / "ckpts" / "epochs"
    assert sorted(os.listdir(epochs)) == ["001", "002", "003", "004", "005"]
    for n in ("001", "002", "003"):
        assert sorted(os.listdir(epochs / n)) == ["ckpt-info.json", "model.h5"]
    assert sorted(os.listdir(epochs / "005")) == ["ckpt-info.json", "model.keras", "train.state.npz"]  # ours, beside
    assert read_link(str(root / "ckpts" / "last")) == "epochs/005"
    reference = compile_model(build_model())
    reference.fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0)
    assert weights_equal(model, reference) and optimizer_equal(model, reference)


def test_develop_checkpoints_adopted_by_candleckptkeras(tmp_path: Path) -> None:
    """A candle_lib-develop directory (<output_dir>/ckpts holding epochs/ directly, relative links, checksum
    __DISABLED__) is resumed by CandleCkptKeras.restart(model) before compile, and training continues there."""
    ckpts = tmp_path / "out" / "ckpts"
    trained, writer = write_candle_dir(ckpts, 2, relative=True, checksum=False)
    assert writer.bodies[2]["checksum"] == "__DISABLED__" and not os.path.isabs(os.readlink(ckpts / "last"))
    params = {"epochs": 4, "output_dir": str(tmp_path / "out"), "ckpt_save_best_metric": "loss"}
    ckpt = CandleCkptKeras(params, verbose=False)
    model = build_model(seed=4)
    ckpt.set_model(model)
    found = ckpt.restart(model)
    assert found == writer.bodies[2]
    assert weights_equal(model, trained)
    compile_model(model)
    x, y = make_data()
    model.fit(x, y, batch_size=16, epochs=4, initial_epoch=found["epoch"], shuffle=False, verbose=0, callbacks=[ckpt])
    ckpt.report_final()
    assert sorted(os.listdir(ckpts / "epochs")) == ["001", "002", "003", "004"]
    assert not (ckpts / "ckpts").exists() and (ckpts / "lock").exists()
    reference = compile_model(build_model())
    reference.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    assert weights_equal(model, reference) and optimizer_equal(model, reference)


def test_absolute_link_inside_is_followed(tmp_path: Path) -> None:
    """CANDLE's ``last`` re-linked (its documented rollback) to the absolute path of epochs/002 while 003 exists:
    restart() resumes epoch 2."""
    root = tmp_path / "save"
    write_candle_dir(root / "ckpts", 3)
    last = root / "ckpts" / "last"
    os.remove(last)
    os.symlink((root / "ckpts" / "epochs" / "002").resolve(), last)
    found = candle_ckpt.restart(master_params(root), compile_model(build_model()), verbose=False)
    assert found["epoch"] == 2


def test_absolute_link_outside_is_refused_with_that_reason(tmp_path: Path, caplog) -> None:
    """A ``last`` pointing at another job's epochs/003 is refused with a message saying it is outside the
    directory; restart() falls back to this directory's own newest valid checkpoint."""
    root, other = tmp_path / "save", tmp_path / "other"
    write_candle_dir(root / "ckpts", 2)
    write_candle_dir(other / "ckpts", 3)
    last = root / "ckpts" / "last"
    os.remove(last)
    target = str((other / "ckpts" / "epochs" / "003").resolve())
    os.symlink(target, last)
    with caplog.at_level(logging.WARNING, logger="candle_ckpt"):
        found = candle_ckpt.restart(master_params(root), compile_model(build_model()), verbose=False)
    assert found["epoch"] == 2
    expected = f"it points to {target!r}, which is outside {root / 'ckpts'}"
    assert any(expected in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_candle_checksum_mismatch_falls_back(tmp_path: Path, caplog) -> None:
    """A model.h5 whose CRC no longer matches CANDLE's decimal checksum is skipped, with the reason."""
    root = tmp_path / "save"
    write_candle_dir(root / "ckpts", 3)
    path = root / "ckpts" / "epochs" / "003" / "model.h5"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="candle_ckpt"):
        found = candle_ckpt.restart(master_params(root), compile_model(build_model()), verbose=False)
    assert found["epoch"] == 2
    assert any("epoch 3" in r.getMessage() and "CRC32 is" in r.getMessage() for r in caplog.records)


def test_keras2_file_loads_weights_and_says_optimizer_starts_fresh(tmp_path: Path, caplog) -> None:
    """A model.h5 stamped by Keras 2: its weights load and a warning says the optimizer starts fresh."""
    root = tmp_path / "save"
    trained, _ = write_candle_dir(root / "ckpts", 2, keras_version="2.15.0", checksum=False)
    model = compile_model(build_model(seed=3))
    with caplog.at_level(logging.WARNING, logger="candle_ckpt"):
        candle_ckpt.restart(master_params(root), model, verbose=False)
    assert weights_equal(model, trained)
    messages = [r.getMessage() for r in caplog.records]
    assert any("written by Keras 2.15.0" in m and "the optimizer starts fresh" in m for m in messages), messages


def test_file_without_optimizer_says_optimizer_starts_fresh(tmp_path: Path, caplog) -> None:
    """A model.h5 saved without optimizer state: weights load, and the warning names why the optimizer is fresh."""
    root = tmp_path / "save"
    write_candle_dir(root / "ckpts", 1, checksum=False)
    with h5py.File(root / "ckpts" / "epochs" / "001" / "model.h5", "a") as f:
        del f["optimizer_weights"]
    with caplog.at_level(logging.WARNING, logger="candle_ckpt"):
        candle_ckpt.restart(master_params(root), compile_model(build_model()), verbose=False)
    assert any("holds no optimizer state" in r.getMessage() for r in caplog.records)


def test_candle_optimizer_state_never_applied_is_reported_loudly(tmp_path: Path, capfd) -> None:
    """restart() before compile() on CANDLE's model.h5 and no fit with the callback: its optimizer state waits in
    the same record as ours, so collecting the model warns that it was never applied (ckpt.log and stderr)."""
    root = tmp_path / "save"
    write_candle_dir(root / "ckpts", 2)
    model = build_model(seed=3)
    candle_ckpt.restart(master_params(root), model, verbose=False)
    del model
    gc.collect()
    assert "epochs/002 was never applied" in (root / "ckpt.log").read_text()
    assert "was never applied" in capfd.readouterr().err


def test_candle_optimizer_that_does_not_fit_is_a_model_mismatch_and_nothing_loads(tmp_path: Path) -> None:
    """A compiled model whose optimizer (SGD with momentum) differs from the file's (Adam): ModelMismatch naming the
    optimizer variables, and the model's weights are not changed."""
    root = tmp_path / "save"
    write_candle_dir(root / "ckpts", 2)
    model = build_model(seed=3)
    model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
    before = model.get_weights()
    with pytest.raises(ModelMismatch, match=r"optimizer state restored from .*epochs/002 does not fit"):
        candle_ckpt.restart(master_params(root), model, verbose=False)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_candle_weights_that_do_not_fit_are_a_model_mismatch_and_nothing_loads(tmp_path: Path) -> None:
    """A model whose last layer is wider than the file's: ModelMismatch with Keras's reason, and the first layer,
    which Keras's loader had already assigned, is put back."""
    root = tmp_path / "save"
    write_candle_dir(root / "ckpts", 2)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    before = model.get_weights()
    with pytest.raises(
        ModelMismatch, match=r"(?s)epochs/002 \(written by CANDLE\) does not match the model: .*not changed"
    ):
        candle_ckpt.restart(master_params(root), model, verbose=False)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_keep_policy_alone_decides_what_of_candles_is_deleted(tmp_path: Path) -> None:
    """With the default keep policy every CANDLE checkpoint stays; with ckpt_keep_limit=1 the policy prunes
    CANDLE's old ones too, but never best, last or the one resumed from."""
    for limit, expected in ((None, ["001", "002", "003", "004"]), (1, ["003", "004"])):
        root = tmp_path / f"limit{limit}" / "save"
        write_candle_dir(root / "ckpts", 3)
        os.remove(root / "ckpts" / "best")
        params = master_params(root, epochs=4) | {"ckpt_save_best": False}
        if limit is not None:
            params["ckpt_keep_limit"] = limit
        model = build_model()
        found = candle_ckpt.restart(params, model, verbose=False)
        compile_model(model)
        cb = CandleCheckpointCallback(params, verbose=False)
        x, y = make_data()
        model.fit(x, y, batch_size=16, epochs=4, initial_epoch=found["epoch"], verbose=0, callbacks=[cb])
        assert sorted(os.listdir(root / "ckpts" / "epochs")) == expected
        cb.engine.store.close()


def test_layouts_are_never_mixed(tmp_path: Path) -> None:
    """CandleCkptKeras (flat) on a directory holding master's ckpts/epochs is refused, naming what to set."""
    root = tmp_path / "save"
    write_candle_dir(root / "ckpts", 1)
    params = {"epochs": 2, "ckpt_directory": str(root)}
    with pytest.raises(ValueError, match=r"holds checkpoints in the nested layout .* set ckpt_directory to"):
        CandleCkptKeras(params, verbose=False)
    with pytest.raises(ValueError, match="never mixed in one directory"):
        candle_ckpt.restart(params | {"ckpt_layout": "flat"}, build_model(), verbose=False)
    assert sorted(os.listdir(root)) == ["ckpts"]  # nothing written by either attempt
