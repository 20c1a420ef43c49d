"""Many fits back to back in one process, under load: the writer lock is never let go in the middle of a fit.

Issue 27 saw ``open_for_write() must be called before commit()`` at an epoch
end three times in the suite on a busy machine: the lock released while the
fit still ran. Here fits that end normally, fits that raise (as a failing
test's do) and refits of the same callback follow each other in one process,
while two CPU-bound processes run beside it; every epoch must be committed.
"""

from __future__ import annotations

import gc
import subprocess
import sys

import keras
import numpy as np
import pytest

import candle_ckpt as candle
from candle_ckpt.core.errors import CheckpointError

X = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
Y = X[:, :1]


class Boom(keras.callbacks.Callback):
    """Raises at the end of the first batch of epoch ``at`` (another callback's error)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self.epoch == self.at and batch == 0:
            raise RuntimeError("boom")

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch = epoch


@pytest.fixture
def load():
    """Two CPU-bound processes beside the test for its whole length."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for proc in burners:
        proc.kill()
        proc.wait(timeout=30)


def test_many_fits_back_to_back_never_lose_the_lock_mid_fit(tmp_path, load) -> None:
    """10 rounds in one process: a fit that raises in its second epoch, the same callback fitting again at
    once, and a fresh callback on the same directory: no save fails, and every fit leaves the lock free."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    for round_ in range(10):
        params = {"ckpt_directory": str(tmp_path / f"r{round_ % 3}"), "epochs": 3, "ckpt_save_best_metric": "loss"}
        ckpt = candle.CandleCheckpointCallback(params, logger=None)
        with pytest.raises(RuntimeError, match="boom"):
            model.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[ckpt, Boom(1)])
        try:
            model.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[ckpt])
            again = candle.CandleCheckpointCallback(params, logger=None)
            model.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[again])
        except CheckpointError as err:
            pytest.fail(f"round {round_}: {err}")
        assert not ckpt.engine.store.is_open and not again.engine.store.is_open
        assert [r["epoch"] for r in ckpt.stats()["saves"]][-3:] == [1, 2, 3]


def test_the_three_sightings_run_back_to_back_under_load_and_every_epoch_commits(tmp_path, load) -> None:
    """The shapes of the three tests that saw the lock gone at an epoch end (issue 27), 3 rounds in one process
    beside two CPU burners: a fresh callback's 1-epoch fit, restart() into an uncompiled model that is then
    collected (test_resume_order), a 3-epoch fit then restart() (test_callback_behaviour), a 2-epoch fit then a
    partial load_weights (test_partial_load). Every fit commits every epoch; no save fails."""

    def build() -> keras.Model:
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="enc"), keras.layers.Dense(1)])

    shapes = {"one-epoch": 1, "three-epochs": 3, "partial": 2}
    for round_ in range(3):
        for name, epochs in shapes.items():
            directory = str(tmp_path / f"r{round_}" / name)
            params = {"ckpt_directory": directory, "epochs": epochs, "ckpt_save_best_metric": "loss"}
            model = build()
            model.compile(optimizer="adam", loss="mse")
            ckpt = candle.CandleCheckpointCallback(params, logger=None)
            try:
                model.fit(X, Y, batch_size=8, epochs=epochs, verbose=0, callbacks=[ckpt])
            except CheckpointError as err:
                pytest.fail(f"round {round_}, {name}: {err}")
            assert [r["epoch"] for r in ckpt.stats()["saves"]] == list(range(1, epochs + 1)), (round_, name)
            assert not ckpt.engine.store.is_open
            fresh = build()
            if name == "partial":
                candle.load_weights(fresh, epochs, layers=["enc"], directory=directory)
            else:
                if name == "three-epochs":
                    fresh.compile(optimizer="adam", loss="mse")
                assert candle.restart(params, fresh, logger=None)["epoch"] == epochs
            del fresh, model, ckpt
            gc.collect()
