"""Every module of candle_ckpt imports on its own, the Keras and tf_keras adapters included."""

from __future__ import annotations

import os
import subprocess
import sys

from locations import REPO

_EACH_ALONE = r"""
import importlib, pkgutil, sys
import candle_ckpt
names = sorted(m.name for m in pkgutil.walk_packages(candle_ckpt.__path__, "candle_ckpt."))
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "candle_ckpt" or m.startswith("candle_ckpt.")]:
        del sys.modules[loaded]  # keras/tensorflow stay loaded: only our import order is under test
    try:
        importlib.import_module(name)
    except Exception as exc:  # report every module that fails, not only the first
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print(len(names), "modules")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_each_module_imports_alone() -> None:
    """Importing any one module first (no other candle_ckpt module loaded) succeeds."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", _EACH_ALONE], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert int(out.stdout.split()[0]) >= 30, out.stdout
