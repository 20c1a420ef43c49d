"""Shared fixtures of the integration tests: a tiny seeded model, data and parameters.

Every test here runs a real ``model.fit``; the model, data and parameters come
from ``jobs/testkit.py``, which the job scripts share.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from testkit import build_model, make_data, make_params  # noqa: E402


@pytest.fixture
def make_model() -> Callable[..., keras.Model]:
    """Factory of tiny compiled models: ``make_model(seed=0, width=16, inputs=8, lr=1e-2)``."""
    return build_model


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    """64 samples of 8 features and one target, seeded."""
    return make_data()


@pytest.fixture
def params() -> Callable[..., dict[str, Any]]:
    """``params(tmp_path, **overrides)`` -> gParameters dict (see :func:`testkit.make_params`)."""
    return make_params
