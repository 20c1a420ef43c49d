"""Suite-wide settings: quiet TensorFlow before anything imports it; TF-only tests off other backends."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# A suite started in the background by a non-interactive shell (``pytest ... &``, a CI runner, nohup)
# inherits SIGINT *ignored*; every job it starts would inherit that too, and a Python child then
# never raises KeyboardInterrupt: a test's Ctrl-C reaches a process that goes on (the demo ran all its
# epochs and exited 0). Give SIGINT Python's own handler here, so children start with its default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# ``locations`` (this folder) and the job scripts' helpers (``testkit``, ``candle_writer``,
# ``runner_loops``) import by name from a test file in any folder.
_TESTS = Path(__file__).resolve().parent
for _folder in (_TESTS / "integration" / "jobs", _TESTS):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


# No test forks the pytest process itself (os.fork, multiprocessing's "fork", subprocess's preexec_fn): by then
# an in-process fit has started TensorFlow's and JAX's threads (candle_ckpt asks jax.process_count(), which
# starts JAX's CPU client), and a forked child can deadlock on a lock one of them held (JAX warns "os.fork() was
# called ..."). A child is started by exec (subprocess without preexec_fn); the forking job servers fork before
# any TensorFlow or JAX op runs (tests/integration/jobs/jobserver.py). The count below is read by _no_fork.
_FORKS = [0]
os.register_at_fork(before=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


@pytest.fixture(autouse=True)
def _no_fork():
    """Fail a test that forked the pytest process (see the comment above)."""
    before = _FORKS[0]
    yield
    if _FORKS[0] != before:
        pytest.fail(
            "this test forked the pytest process (os.fork, a multiprocessing 'fork' or subprocess's preexec_fn), "
            "where an in-process fit leaves TensorFlow and JAX threads: start the child by exec (no preexec_fn; "
            "a shell's trap for signals)",
            pytrace=False,
        )


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
