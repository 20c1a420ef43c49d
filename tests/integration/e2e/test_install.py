"""Installs in fresh virtual environments: without the ``tf`` extra no TensorFlow comes and JAX works; the
keras-nightly install of docs/api.rst keeps keras-nightly; the wheel builds.

The tests marked ``needs_index`` download from a package index (PyPI); CI runs them, and
``-m "not needs_index"`` leaves them out on a machine without one.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import venv
from pathlib import Path

import pytest
from doclines import DOCS, blocks
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


@pytest.mark.needs_index
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


def nightly_install() -> str:
    """docs/api.rst's install for keras-nightly users (the literal block with ``--no-deps``)."""
    (command,) = [b.astext() for b in blocks(DOCS / "api.rst") if "--no-deps" in b.astext()]
    return command


def test_the_keras_nightly_install_names_every_requirement_but_keras() -> None:
    """The documented keras-nightly install is candle_ckpt without dependencies plus exactly setup.cfg's
    install_requires without keras (so a new requirement cannot be forgotten there)."""
    first, second = (shlex.split(part) for part in nightly_install().split("&&"))
    assert first == ["python3", "-m", "pip", "install", "--no-deps", "-e", "."], first
    assert second[:4] == ["python3", "-m", "pip", "install"], second
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    required = [line.strip() for line in cfg["options"]["install_requires"].splitlines() if line.strip()]
    assert sorted(second[4:]) == sorted(r for r in required if not r.startswith("keras")), (second, required)


@pytest.mark.needs_index
@pytest.mark.needs_package("jax")  # the check imports keras-nightly on JAX, from this environment
def test_the_keras_nightly_install_keeps_keras_nightly(tmp_path: Path) -> None:
    """In a virtual environment on this one with the keras-nightly CI tests installed, docs/api.rst's install
    (run as written, in a copy of the checkout) installs candle_ckpt and no released Keras: keras-nightly is
    imported, candle_ckpt comes from the copy, and nothing says two Keras distributions are mixed."""
    nightly = re.search(r'NEXT_KERAS="(keras-nightly==[^"]+)"', (REPO / ".ci" / "run").read_text()).group(1)
    env_dir, checkout = tmp_path / "venv", tmp_path / "checkout"
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    shutil.copytree(REPO / "candle_ckpt", checkout / "candle_ckpt", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "setup.py", "README.rst"):
        shutil.copy(REPO / name, checkout / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}", PIP_DISABLE_PIP_VERSION_CHECK="1")
    shell = ["/bin/sh", "-ec", f"python3 -m pip install --quiet {nightly} && {nightly_install()}"]
    done = subprocess.run(shell, cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("keras-*.dist-info")), sorted(p.name for p in site.iterdir())
    check = "import candle_ckpt, keras; candle_ckpt.restart; print(keras.__version__, candle_ckpt.__file__)"
    env.update(TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="jax")
    ran = subprocess.run(["python3", "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    version, where = ran.stdout.split()
    assert version == nightly.split("==")[1], ran.stdout
    assert where == str(checkout / "candle_ckpt" / "__init__.py")
    assert "installed over each other" not in ran.stderr, ran.stderr
