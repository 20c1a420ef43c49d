"""The tiny seeded model, data and parameters shared by the integration tests and the job scripts.

Models are kept tiny (Dense 8->16->1) so a real ``model.fit`` takes milliseconds.
Tests import them by name (``from testkit import build_model``): ``tests/conftest.py``
puts this folder on ``sys.path``; a job script run as a subprocess finds it beside itself.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build_model(seed: int = 0, *, width: int = 16, inputs: int = 8, lr: float = 1e-2) -> keras.Model:
    """Return a compiled Dense ``inputs -> width -> 1`` model with Adam, seeded."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((inputs,)), keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=lr), loss="mse")
    return model


def make_data(seed: int = 0, n: int = 64, inputs: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Return seeded synthetic regression data ``(x, y)`` as float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, inputs)).astype("float32")
    y = (x @ rng.standard_normal((inputs, 1)) + 0.1 * rng.standard_normal((n, 1))).astype("float32")
    return x, y


def make_params(tmp_path: str | os.PathLike[str], **overrides: Any) -> dict[str, Any]:
    """Return a gParameters dict checkpointing into ``<tmp_path>/save``.

    Defaults: 3 epochs, save every epoch, best judged on ``loss`` (present
    without validation data), restart mode auto. ``overrides`` win.
    """
    params: dict[str, Any] = {
        "epochs": 3,
        "ckpt_directory": str(Path(tmp_path) / "save"),
        "ckpt_restart_mode": "auto",
        "ckpt_save_best_metric": "loss",
        "ckpt_save_interval": 1,
    }
    params.update(overrides)
    return params


def checkpoint_files(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory`` but ckpt.log, the writer's lock file and JAX's compilation cache (not a
    checkpoint: a rerun may add to it), with its bytes and mtime."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in ("ckpt.log", "lock") and "compile-cache" not in p.relative_to(directory).parts
    }


def finished_line(where: Path, epoch: int, stopped_by: str | None) -> str:
    """The line a finished ``fit``'s rerun logs (``engine/finished.py``): after ``stopped_by`` or the last epoch."""
    if stopped_by:
        why = f"{stopped_by} ended it after epoch {epoch}"
        how = f"to train on from there on purpose, set ckpt_restart_epoch={epoch}"
    else:
        why, how = (
            f"its checkpoint is of epoch {epoch} and fit() was called with epochs={epoch}",
            f"to train on, pass epochs > {epoch}",
        )
    return f"WARNING the run is finished: {why} ({where}); this fit() trains nothing; {how}"


def assert_said_once(log_file: Path, expected: str, *about: str) -> None:
    """``log_file`` has one line ending with ``expected`` and no other line containing any of ``about``."""
    log = log_file.read_text().splitlines()
    assert [line for line in log if any(a in line for a in about)] == [line for line in log if line.endswith(expected)]
    assert len([line for line in log if line.endswith(expected)]) == 1
