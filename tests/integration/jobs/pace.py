"""How slow this machine is now: one reference job, timed once per test session; every job wait scales from it.

A busy machine (other suites, CPU-bound neighbours) makes every subprocess
slower by about the same factor. :func:`slowdown` runs the reference job (a
fresh Python that imports Keras and fits a tiny model, what every job does
first) once and compares its wall time with :data:`QUIET_S`, its time on a
quiet 2-core machine; :func:`wait_s` scales a wait measured on that quiet
machine. ``CANDLE_TEST_SLOWDOWN=F`` sets the factor instead of measuring.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

QUIET_S = 5.0  # the reference job on a quiet 2-core machine (17.5 s at load average 10)
REFERENCE = """
import keras, numpy as np
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]); m.compile(optimizer="sgd", loss="mse")
m.fit(np.zeros((64, 4)), np.zeros((64, 1)), epochs=2, batch_size=16, verbose=0)
"""
_factor: list[float] = []  # measured once per process (a pytest session)


def slowdown() -> float:
    """This machine's slowdown against a quiet one (at least 1), measured at the first call."""
    if not _factor:
        given = os.environ.get("CANDLE_TEST_SLOWDOWN")
        if given:
            _factor.append(max(1.0, float(given)))
        else:
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
            start = time.monotonic()
            subprocess.run([sys.executable, "-c", REFERENCE], env=env, capture_output=True, timeout=600, check=True)
            _factor.append(max(1.0, (time.monotonic() - start) / QUIET_S))
    return _factor[0]


def wait_s(quiet_s: float) -> float:
    """A wait of ``quiet_s`` seconds on a quiet machine, scaled to this one."""
    return quiet_s * slowdown()
