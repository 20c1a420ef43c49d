"""A job on the JAX backend with TensorFlow installed: Keras loads TensorFlow at the first save (its ``.keras``
serialization), and candle_ckpt's save drops the start-up lines that load prints (they came mid-training)."""

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
def test_a_save_on_jax_that_loads_tensorflow_prints_none_of_its_start_up_lines(tmp_path: Path) -> None:
    """With TF_CPP_MIN_LOG_LEVEL unset, the first save (which loads TensorFlow) writes its own log line and no
    start-up line; with TF_CPP_MIN_LOG_LEVEL=0 (asked for) they are shown, so the first run is not vacuous."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(KERAS_BACKEND="jax", PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    quiet = subprocess.run([sys.executable, "-c", JOB], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    after = quiet.stderr.split("fit starts\n", 1)[1]
    assert "tensorflow loaded: True" in after and "saved 001 (final)" in after, after
    assert "0000 00:00:" not in after and "absl::InitializeLog" not in after, after
    (tmp_path / "loud").mkdir()
    loud = subprocess.run([sys.executable, "-c", JOB], cwd=tmp_path / "loud", env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"},
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert "absl::InitializeLog" in loud.stderr.split("fit starts\n", 1)[1], loud.stderr[-3000:]
