"""Suite-wide settings: quiet TensorFlow before anything imports it; TF-only tests off other backends."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# ``locations`` (this folder) and the job scripts' helpers (``testkit``, ``candle_writer``,
# ``runner_loops``) import by name from a test file in any folder.
_TESTS = Path(__file__).resolve().parent
for _folder in (_TESTS / "integration" / "jobs", _TESTS):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``tf_only`` tests when the Keras backend is not TensorFlow (``KERAS_BACKEND=jax`` or ``torch``)."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"tf_only: needs KERAS_BACKEND=tensorflow (this run: {backend})")
    for item in items:
        if item.get_closest_marker("tf_only"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _end_early_catch():
    """One pytest process runs many programs: the signals a test's ``restart()`` caught for a fit that never
    came (docs/preemption.rst) get their handlers back after that test, as at the end of its program."""
    yield
    from candle_ckpt.engine.preempt import end_early_catch

    end_early_catch(deliver=False)
