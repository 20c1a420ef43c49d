"""A job on the JAX backend with TensorFlow installed: Keras's ``.keras`` serialization loaded TensorFlow at the
first save, whose start-up lines then came mid-training; the gateway keeps it from loading it at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import REPO

JOB = """
import sys
import keras, numpy as np
import candle_ckpt
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
print("fit starts", file=sys.stderr, flush=True)
callback = candle_ckpt.CandleCheckpointCallback({"epochs": 1, "ckpt_save_best": False, "ckpt_directory": "save"})
model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=1, verbose=0, callbacks=[callback])
print("tensorflow loaded:", "tensorflow" in sys.modules, file=sys.stderr)
"""


@pytest.mark.needs_package("jax")
def test_a_save_on_jax_loads_no_tensorflow_and_prints_none_of_its_start_up_lines(tmp_path: Path) -> None:
    """With TF_CPP_MIN_LOG_LEVEL unset and TensorFlow installed, the first save on JAX writes its own log line, does
    not load TensorFlow (Keras's serializer used to, and its start-up lines came in the middle of training: the
    gateway answers 'not available' while it is not loaded) and so prints no start-up line."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(KERAS_BACKEND="jax", PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    quiet = subprocess.run([sys.executable, "-c", JOB], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    after = quiet.stderr.split("fit starts\n", 1)[1]
    assert "tensorflow loaded: False" in after and "saved 001 (final)" in after, after
    assert "0000 00:00:" not in after and "absl::InitializeLog" not in after, after
