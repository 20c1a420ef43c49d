"""candle_ckpt.load_weights: only the named layers, CRC verified first, clear errors, all-or-nothing."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from candle_ckpt import CandleCheckpointCallback, CorruptCheckpoint, ModelMismatch, load_weights  # noqa: E402


def build(seed: int, enc_width: int = 16) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(enc_width, activation="relu", name="enc"),
            keras.layers.Dense(4, activation="relu", name="mid"),
            keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


@pytest.fixture
def trained(tmp_path: Path) -> tuple[keras.Model, Path]:
    """A model trained 2 epochs with the callback; returns it and its ckpt_directory."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 8)).astype("float32"), rng.standard_normal((32, 1)).astype("float32")
    model = build(0)
    d = tmp_path / "save"
    cb = CandleCheckpointCallback({"epochs": 2, "ckpt_directory": str(d), "ckpt_save_best_metric": "loss"}, logger=None)
    model.fit(x, y, epochs=2, batch_size=8, callbacks=[cb], verbose=0)
    return model, d


def weights(model: keras.Model, name: str) -> list[np.ndarray]:
    return [v.numpy() for v in model.get_layer(name).weights]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_loads_only_named_layers(trained) -> None:
    """Only 'enc' takes the checkpoint's weights; the other layers keep their own; stats are returned and logged."""
    model, d = trained
    fresh = build(5)
    mid, head = weights(fresh, "mid"), weights(fresh, "head")
    stats = load_weights(fresh, d / "ckpts" / "epochs" / "002", layers=["enc"])
    assert same(weights(fresh, "enc"), weights(model, "enc"))
    assert same(weights(fresh, "mid"), mid) and same(weights(fresh, "head"), head)
    assert not same(mid, weights(model, "mid"))
    assert stats["layers"] == ["enc"] and stats["bytes"] > 0 and stats["mb_per_s"] > 0
    assert "load_weights: 1 layer(s) ['enc']" in (d / "ckpt.log").read_text()


def test_predicate_and_epoch_number(trained) -> None:
    """A predicate over layers and an epoch number with directory= select the same way."""
    model, d = trained
    fresh = build(5)
    load_weights(fresh, 2, layers=lambda layer: layer.name in ("mid", "head"), directory=d)
    assert same(weights(fresh, "mid"), weights(model, "mid")) and same(weights(fresh, "head"), weights(model, "head"))
    assert not same(weights(fresh, "enc"), weights(model, "enc"))


def test_transfer_into_a_different_architecture_by_name(trained) -> None:
    """A target model with extra layers in another order still gets 'head' from the layer named 'head'."""
    model, d = trained
    keras.utils.set_random_seed(9)
    target = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, name="pre"),
            keras.layers.Dense(4, name="extra"),
            keras.layers.Dense(4, name="other"),
            keras.layers.Dense(1, name="head"),
        ]
    )  # 'head' is at H5 path layers/dense_3 here, layers/dense_2 in the checkpoint
    load_weights(target, d / "ckpts" / "epochs" / "002", layers=["head"])
    assert same(weights(target, "head"), weights(model, "head"))


def test_unknown_layer_name_lists_available(trained) -> None:
    """An unknown name raises ValueError naming it and listing the model's layers; nothing changes."""
    _, d = trained
    fresh = build(5)
    before = [v.numpy() for v in fresh.weights]
    with pytest.raises(ValueError, match=r"unknown layer name\(s\) \['decoder'\]; .*\['enc', 'head', 'mid'\]"):
        load_weights(fresh, d / "ckpts" / "epochs" / "002", layers=["enc", "decoder"])
    assert same([v.numpy() for v in fresh.weights], before)


def test_shape_mismatch_names_layer_and_shapes(trained) -> None:
    """A layer of another width raises ModelMismatch (a ValueError) with the layer and both shapes; nothing loads."""
    _, d = trained
    wide = build(5, enc_width=32)
    before = [v.numpy() for v in wide.weights]
    with pytest.raises(ModelMismatch, match=r"shape mismatch for layer 'enc' .*model \(8, 32\), checkpoint \(8, 16\)"):
        load_weights(wide, d / "ckpts" / "epochs" / "002", layers=["head", "enc"])
    assert same([v.numpy() for v in wide.weights], before)


def test_crc_failure_loads_nothing(trained) -> None:
    """A flipped byte in the weights file raises CorruptCheckpoint (CRC32) before anything is loaded."""
    _, d = trained
    path = d / "ckpts" / "epochs" / "002" / "model.keras"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    fresh = build(5)
    before = [v.numpy() for v in fresh.weights]
    with pytest.raises(CorruptCheckpoint, match=r"model\.keras: CRC32 is [0-9a-f]{8} but the sidecar recorded"):
        load_weights(fresh, d / "ckpts" / "epochs" / "002", layers=["enc"])
    assert same([v.numpy() for v in fresh.weights], before)


def test_bad_checkpoint_argument(tmp_path: Path) -> None:
    """A path that is not ckpts/epochs/NNN, or an epoch number without directory=, is refused clearly."""
    with pytest.raises(ValueError, match=r"is not a checkpoint directory <ckpt_directory>/ckpts/epochs/NNN"):
        load_weights(build(0), tmp_path, layers=["enc"])
    with pytest.raises(ValueError, match=r"an epoch number needs directory="):
        load_weights(build(0), 3, layers=["enc"])
