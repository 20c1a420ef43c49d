"""Suite-wide settings: quiet TensorFlow before anything imports it; TF-only tests off other backends."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``tf_only`` tests when the Keras backend is not TensorFlow (``KERAS_BACKEND=jax`` or ``torch``)."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"tf_only: needs KERAS_BACKEND=tensorflow (this run: {backend})")
    for item in items:
        if item.get_closest_marker("tf_only"):
            item.add_marker(skip)
