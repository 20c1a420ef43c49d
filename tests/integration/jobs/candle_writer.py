"""Write checkpoints the way ECP-CANDLE itself does, to test that candle_ckpt adopts them.

It follows CANDLE's procedure and format (Benchmarks ``common/ckpt_keras_utils.py``,
candle_lib ``candle/ckpt_utils.py``), not its code: for each saved epoch,

1. ``model.save(<ckpts>/work/model.h5)`` (Keras's HDF5 format, optimizer included);
2. ``<ckpts>/work/ckpt-info.json``: ``json.dump`` of ``epoch`` (completed epochs),
   ``save_best_metric``, ``best_metric_last``, ``model_file``, ``checksum``
   (``str(zlib.crc32(model.h5))`` or ``"__DISABLED__"``), ``timestamp``
   (``%Y-%m-%d %H:%M:%S``), ``time_elapsed`` (``"__FIRST__"`` or seconds since the
   previous save) and ``metadata``, then a newline;
3. rename ``work`` to ``epochs/NNN``;
4. ``best`` (if improved) and ``last``: removed, then symlinked to the *absolute,
   resolved* path of ``epochs/NNN`` (CANDLE's ``PosixPath(...).resolve()``), or
   relatively when asked.

Where ``<ckpts>`` is: Benchmarks master: ``<ckpt_directory>/ckpts`` (default
``./save/ckpts``); candle_lib develop: ``<output_dir>/ckpts`` itself.

Run as a script it trains the test model and writes such a directory::

    python candle_writer.py CKPTS_DIR EPOCHS [--relative] [--no-checksum]
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import zlib
from datetime import datetime
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402


class CandleStyleWriter(keras.callbacks.Callback):
    """Save every epoch the way CANDLE's callback does (best on ``metric``, which decreases)."""

    def __init__(
        self,
        ckpts: str | os.PathLike[str],
        *,
        metric: str = "loss",
        checksum: bool = True,
        relative: bool = False,
        keras_version: str | None = None,
    ) -> None:
        super().__init__()
        self.ckpts = Path(ckpts).resolve()
        self.metric, self.checksum, self.relative = metric, checksum, relative
        self.keras_version = keras_version  # stamp another version into model.h5 (a Keras 2 file)
        self.best = math.inf
        self.last_time: datetime | None = None
        self.bodies: dict[int, dict] = {}

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        epoch += 1
        value = float(logs[self.metric])
        improved = value < self.best
        if improved:
            self.best = value
        work, this = self.ckpts / "work", self.ckpts / "epochs" / f"{epoch:03d}"
        if this.exists():
            shutil.rmtree(this)
        (self.ckpts / "epochs").mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        model_file = work / "model.h5"
        self.model.save(model_file)
        if self.keras_version is not None:
            import h5py

            with h5py.File(model_file, "a") as f:
                f.attrs["keras_version"] = self.keras_version
        self.bodies[epoch] = self._write_json(work / "ckpt-info.json", epoch, model_file)
        os.rename(work, this)
        if improved:
            self._symlink(this, self.ckpts / "best")
        self._symlink(this, self.ckpts / "last")

    def _write_json(self, path: Path, epoch: int, model_file: Path) -> dict:
        now = datetime.now()
        crc = str(zlib.crc32(model_file.read_bytes())) if self.checksum else "__DISABLED__"
        body = {
            "epoch": epoch,
            "save_best_metric": self.metric,
            "best_metric_last": self.best,
            "model_file": "model.h5",
            "checksum": crc,
            "timestamp": now.strftime("%Y-%m-%d %H:%M:%S"),
            "time_elapsed": "__FIRST__" if self.last_time is None else (now - self.last_time).total_seconds(),
            "metadata": None,
        }
        self.last_time = now
        with open(path, "w") as fp:
            json.dump(body, fp)
            fp.write("\n")
        return body

    def _symlink(self, src: Path, dst: Path) -> None:
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(os.path.relpath(src, dst.parent) if self.relative else src, dst)


def build_model(seed: int = 1) -> keras.Model:
    """The uncompiled test model (CANDLE scripts restart before compile)."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


def compile_model(model: keras.Model) -> keras.Model:
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    return model


def make_data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1)) + 0.1 * rng.standard_normal((64, 1))).astype("float32")
    return x, y


def write_candle_dir(ckpts: str | os.PathLike[str], epochs: int, **kwargs) -> tuple[keras.Model, CandleStyleWriter]:
    """Train the test model for ``epochs`` and write CANDLE-style checkpoints into ``ckpts``."""
    model = compile_model(build_model())
    writer = CandleStyleWriter(ckpts, **kwargs)
    x, y = make_data()
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=[writer])
    return model, writer


if __name__ == "__main__":
    write_candle_dir(
        sys.argv[1], int(sys.argv[2]), relative="--relative" in sys.argv, checksum="--no-checksum" not in sys.argv
    )
    print("written", sys.argv[1])
