"""A fresh virtualenv: ``pip install candle_ckpt`` without the ``tf`` extra brings no TensorFlow, and works on JAX."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

from locations import REPO

CHECK = """
import importlib.util, os, sys
assert importlib.util.find_spec("tensorflow") is None, "tensorflow is installed"
import keras
import candle_ckpt
from candle_ckpt import CandleCheckpointCallback, JobRunner, load_weights, restart
from candle_ckpt.cli.main import main
assert not any(m.split(".")[0] == "tensorflow" for m in sys.modules)
print("backend", keras.backend.backend(), "from", os.path.dirname(candle_ckpt.__file__))
"""


def test_install_without_tf_extra_has_no_tensorflow_and_imports_under_jax(tmp_path: Path) -> None:
    """In a new virtualenv, installing the package (and jax[cpu]) installs no TensorFlow, and the public API
    imports under KERAS_BACKEND=jax from the installed copy."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(REPO), "jax[cpu]"]
    out = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    ran = subprocess.run([python, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.startswith("backend jax from " + str(env_dir)), ran.stdout


def test_the_wheel_builds_and_installs_and_its_command_runs(tmp_path: Path) -> None:
    """The install the README gives without PyPI: `pip wheel --no-deps .` builds one wheel; installed from it
    (into a fresh target) the package imports from there, holds every subpackage, and `candle-ckpt --version` runs."""
    import sys

    dist, site = tmp_path / "dist", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("candle_ckpt-*.whl")
    done = subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "candle_ckpt").rglob("__init__.py")}
    assert all((site / p / "__init__.py").exists() for p in packages), sorted(packages)
    env = dict(os.environ, PYTHONPATH=str(site))
    check = "import candle_ckpt, sys; print(candle_ckpt.__file__)"
    ran = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.strip() == str(site / "candle_ckpt" / "__init__.py"), ran
    version = subprocess.run([sys.executable, str(site / "bin" / "candle-ckpt"), "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("candle-ckpt "), version
