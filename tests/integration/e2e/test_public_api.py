"""The names a user imports from ``candle_ckpt`` stay what the README says they are."""

from __future__ import annotations

import subprocess
import sys

from locations import REPO


def test_restart_stays_a_function_after_any_submodule_import():
    """Importing every candle_ckpt submodule first never turns ``candle_ckpt.restart`` into a module.

    A package attribute is replaced by a submodule of the same name when that
    submodule is imported; the function therefore lives in ``keras_restart``.
    """
    code = (
        "import importlib, pkgutil, candle_ckpt\n"
        "for m in pkgutil.walk_packages(candle_ckpt.__path__, 'candle_ckpt.'):\n"
        "    if m.name not in ('candle_ckpt.__main__', 'candle_ckpt.tf_keras.adapter'):\n"
        "        importlib.import_module(m.name)\n"
        "import inspect\n"
        "from candle_ckpt import restart, CandleCheckpointCallback\n"
        "assert inspect.isfunction(restart), restart\n"
        "assert inspect.isfunction(candle_ckpt.restart), candle_ckpt.restart\n"
        "assert inspect.isclass(CandleCheckpointCallback)\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")
