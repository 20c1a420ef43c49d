"""``train.state.npz`` is small and reads both of its forms (issue 27, item 6)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import keras
import numpy as np

import candle_ckpt as candle
from candle_ckpt.keras.train_state import pack, unpack


def test_the_quickstart_checkpoints_train_state_is_compact_json_bytes(tmp_path: Path) -> None:
    """A Quickstart-sized fit: train.state.npz stores its JSON as UTF-8 bytes (uint8), compressed, and stays
    well under the model file (it was 62 kB of UTF-32 beside a 23 kB model.keras)."""
    params = {"epochs": 1, "ckpt_directory": str(tmp_path)}
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    ckpt = candle.CandleCheckpointCallback(params, verbose=False)
    model.fit(x, x[:, :1], validation_split=0.25, epochs=1, verbose=0, callbacks=[ckpt])
    folder = tmp_path / "ckpts" / "epochs" / "001"
    data = (folder / "train.state.npz").read_bytes()
    with np.load(io.BytesIO(data)) as npz:
        assert npz["__doc__"].dtype == np.uint8
    doc, _ = unpack(data)
    assert set(doc) >= {"rng", "callbacks", "pipeline"}
    assert len(data) < 16_000 and len(data) < (folder / "model.keras").stat().st_size


def test_a_train_state_written_in_the_first_form_is_still_read(tmp_path: Path) -> None:
    """The first form (the JSON as a NumPy unicode string, uncompressed) reads as the same document and arrays."""
    doc = {"rng": {"numpy": ["MT19937", 5]}, "callbacks": {}, "pipeline": {"kind": "arrays", "epoch": 2}}
    arrays = {"rng.numpy.keys": np.arange(624, dtype=np.uint32)}
    old = io.BytesIO()
    np.savez(old, __doc__=np.array(json.dumps(doc)), **arrays)
    for data in (old.getvalue(), pack(doc, arrays)):
        got, got_arrays = unpack(data)
        assert got == doc
        assert got_arrays.keys() == arrays.keys()
        assert got_arrays["rng.numpy.keys"].tobytes() == arrays["rng.numpy.keys"].tobytes()
    assert len(pack(doc, arrays)) < len(old.getvalue())
