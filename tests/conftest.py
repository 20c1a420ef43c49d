"""Suite-wide settings: quiet TensorFlow before anything imports it; TF-only tests off other backends; tests of an
optional package skipped, naming it, where it is missing."""

from __future__ import annotations

import importlib.util
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


# The optional packages tests may need (``needs_package``), and how a user installs each: the ``test`` extra of
# setup.cfg brings none of them, so the README's test command skips these tests, saying what to install.
OPTIONAL = {
    "jax": 'pip install "jax[cpu]"',
    "torch": "pip install torch",
    "orbax": "pip install orbax-checkpoint",
    "grain": "pip install grain",
}


def missing_packages(item: pytest.Item) -> list[str]:
    """The packages an item's ``needs_package`` markers name that are not installed (all must be in OPTIONAL)."""
    names = [name for mark in item.iter_markers("needs_package") for name in mark.args]
    unknown = set(names) - set(OPTIONAL)
    assert not unknown, f"{item.nodeid}: needs_package names {sorted(unknown)}; known: {sorted(OPTIONAL)}"
    return [name for name in dict.fromkeys(names) if importlib.util.find_spec(name) is None]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``tf_only`` tests when the Keras backend is not TensorFlow (``KERAS_BACKEND=jax`` or ``torch``), and a
    ``needs_package`` test whose package is not installed, naming it and its install command."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    skip = pytest.mark.skip(reason=f"tf_only: needs KERAS_BACKEND=tensorflow (this run: {backend})")
    for item in items:
        if backend != "tensorflow" and item.get_closest_marker("tf_only"):
            item.add_marker(skip)
        missing = missing_packages(item)
        if missing:
            how = "; ".join(OPTIONAL[name] for name in missing)
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(missing)}, not installed ({how})"))


@pytest.fixture(autouse=True)
def _signal_handlers_back():
    """One pytest process runs many programs: the signals a test's ``restart()`` caught for a fit that never
    came (docs/preemption.rst) get their handlers back after that test, as at the end of its program."""
    yield
    from candle_ckpt.engine.signals import process_signals

    process_signals().teardown(deliver=False)
