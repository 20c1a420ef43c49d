"""What a job's start-up imports of ours: nothing heavy at ``import candle_ckpt``, and no TensorFlow on JAX.

Fresh processes on the JAX backend with TensorFlow installed, as users have it. TensorFlow's import takes
seconds; a JAX job that does not use it should not pay for it at start-up, in ``restart()`` or at its saves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import REPO, job_script
from pace import wait_s

pytest.importorskip("jax")

_HEAVY = ("tensorflow", "tf_keras", "keras", "jax", "h5py", "fsspec", "matplotlib", "zlib_ng", "numpy")
_IMPORT_ONLY = f"""
import sys
import candle_ckpt
first = sorted({{m.split(".")[0] for m in sys.modules}} & set({_HEAVY!r}))
candle_ckpt.ckpt_parser, candle_ckpt.restart, candle_ckpt.CandleCheckpointCallback
names = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tf_keras"))
print("FIRST", first, "NAMES", names)
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def test_import_candle_ckpt_loads_no_framework_and_the_job_names_no_tensorflow() -> None:
    """`import candle_ckpt` loads no framework or heavy library; the names a job uses (ckpt_parser, restart, the
    callback) load Keras and JAX on the JAX backend, never TensorFlow."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_ONLY], env=_env(), capture_output=True, text=True, timeout=wait_s(60)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FIRST [] NAMES []" in proc.stdout, proc.stdout


def test_a_jax_job_and_its_restart_never_import_tensorflow(tmp_path: Path) -> None:
    """A JAX job (restart(), the callback, fit with validation, a save each epoch), then its restart in a new
    process, finish without importing TensorFlow (Keras's serializer would import it at the first save)."""
    for epochs in (1, 2):
        proc = subprocess.run(
            [sys.executable, str(job_script("compile_cache_job.py")), str(tmp_path), str(epochs)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=wait_s(60),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
        assert result["tensorflow_loaded"] is False, f"run to epoch {epochs}"
    assert (tmp_path / "ckpts" / "epochs" / "002" / "ckpt-info.json").is_file()
