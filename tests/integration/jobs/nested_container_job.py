"""Train one epoch of a model whose layer holds layers in nested lists, checkpointing into argv[1].

Run by ``test_keras_versions.py`` under an older Keras: Keras 3.15 changed how
such layers are stored. Prints the Keras version last.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
from testkit import make_data  # noqa: E402


@keras.saving.register_keras_serializable(package="candle_ckpt_tests")
class Blocks(keras.layers.Layer):
    """Two Dense layers held in a list inside a list (a "container" to Keras's saver)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.blocks = [[keras.layers.Dense(4), keras.layers.Dense(8)]]

    def call(self, x):
        for layer in self.blocks[0]:
            x = layer(x)
        return x


def build() -> keras.Model:
    """A compiled, built model: Input(8) -> Blocks -> Dense(1), Adam."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), Blocks(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def main(directory: str) -> None:
    import candle_ckpt as candle

    params = {"epochs": 1, "ckpt_directory": directory, "ckpt_save_best_metric": "loss", "ckpt_save_interval": 1}
    x, y = make_data()
    cb = candle.CandleCheckpointCallback(params, logger=None)
    build().fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[cb])
    print("keras", keras.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
