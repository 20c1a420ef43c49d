"""Console hygiene for the demo and the CLI: TensorFlow's start-up lines, Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

# Light imports only (the store, tempfile and keras inside the functions): candle_ckpt.cli.main imports
# this module before it can answer Ctrl-C.
DEMO_DIRECTORY = "./candle_ckpt_demo"
PROG = "candle-ckpt"
EXIT_OK, EXIT_CORRUPT, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130  # candle_ckpt.cli.main's docstring


def import_keras_quietly() -> ModuleType:
    """Import keras (and TensorFlow) without TensorFlow's C++ start-up lines.

    TensorFlow 2.21 prints its oneDNN / CUDA / CPU-feature lines on file
    descriptor 2 while it loads, whatever ``TF_CPP_MIN_LOG_LEVEL`` says at that
    point, so stderr is pointed at a temporary file for the import. If the
    import fails, what was written there is shown. A user who asks for TF's
    logs (``TF_CPP_MIN_LOG_LEVEL`` of 0, 1 or 2) sees them.

    Ctrl-C is held while the import runs (:func:`_sigint_held`) and answered when it ends.
    """
    if "keras" in sys.modules:
        return sys.modules["keras"]
    with _sigint_held():
        return _import_keras()


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Hold SIGINT (blocked in the main thread, and so in the threads it starts) while the body runs.

    A KeyboardInterrupt raised inside TensorFlow's import (2.21, which imports JAX from tf.lite) can
    crash the process (SIGSEGV or SIGABRT, seen about 2 s into ``candle-ckpt demo`` in a sweep of
    delivery times) or leave a native library half loaded that prints its start-up lines later. A
    held SIGINT is delivered when the body ends, so the interrupt is raised after the import.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _import_keras() -> ModuleType:
    with native_stderr_hidden():
        import keras
    return keras


@contextlib.contextmanager
def native_stderr_hidden() -> Iterator[None]:
    """While the body runs, file descriptor 2 goes to a temporary file: TensorFlow's start-up lines, written
    there by its C++ code while it loads, are not shown; if the body raises, what was written is shown.

    Around whatever may load TensorFlow: ``import keras`` (TensorFlow backend), and on the JAX backend
    ``model.save``, where Keras's serialization imports TensorFlow if it is installed (keras 3.15,
    ``serialization_lib``: ``tf.available``). A user who asks for TF's logs (``TF_CPP_MIN_LOG_LEVEL`` of
    0, 1 or 2) sees them.
    """
    level = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if level in ("0", "1", "2") or "tensorflow" in sys.modules:  # asked for, or already loaded (said its lines)
        yield
        return
    from candle_ckpt.core.stderr import descriptor_2_captured

    # Shown only when the body failed with an error (Ctrl-C during it needs no TF noise).
    with descriptor_2_captured(lambda text, error: text if isinstance(error, Exception) else ""):
        yield


def saved_so_far(directory: str) -> str:
    """What a stopped job leaves behind, in words: the epoch ``last`` points to, and where.

    Standard library only (no store, no numpy): Ctrl-C may have cut an import of numpy short, after
    which numpy cannot be imported again in this process.
    """
    from candle_ckpt.core import layout as L
    from candle_ckpt.core.fs import read_link

    layout = L.Layout.at(directory)
    try:
        target = read_link(layout.link("last"))
    except (OSError, ValueError):
        target = None
    ckpts = os.path.normpath(layout.ckpts)
    last = L.resolve_link_target(target, (ckpts, os.path.realpath(ckpts)))[0] if target else None
    if last is None:
        return f"no checkpoint was saved yet in {layout.root}"
    return f"the last checkpoint is epoch {last} in {layout.root}"


_SEEN: list[int] = []  # SIGINTs received while watch_sigint() was on
_DEFERRED: list[bool] = []  # non-empty while sigint_deferred() is on


def _on_sigint(signum: int, frame: object) -> None:
    _SEEN.append(signum)
    if _DEFERRED and len(_SEEN) == 1:
        return  # remembered: the body of sigint_deferred() answers it at its next safe point
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """While the body runs, a first Ctrl-C is only remembered (:func:`sigint_seen`); a second one raises at once.

    Around the demo's ``fit``: a KeyboardInterrupt raised in the middle of TensorFlow's work (tracing the
    first step, building the input pipeline) can crash the process as one inside its import can
    (:func:`_sigint_held`; SIGSEGV once, as ``fit`` started, under a busy CI), so the demo's callback
    answers it where Keras is between batches.
    """
    _DEFERRED.append(True)
    try:
        yield
    finally:
        _DEFERRED.pop()


def _unraisable(hook: Any) -> None:
    # A KeyboardInterrupt raised where Python cannot raise it (a weakref callback of the import system,
    # a __del__) is dropped with an "Exception ignored" traceback; interrupted() answers it instead.
    if not isinstance(hook.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(hook)


@contextlib.contextmanager
def watch_sigint(demo: bool = False) -> Iterator[None]:
    """While on, Ctrl-C raises KeyboardInterrupt and is remembered (:func:`sigint_seen`).

    Some code does not let a KeyboardInterrupt through: numpy's import turns one into an
    ImportError, and the import system's weakref callbacks drop it. The command checks
    :func:`sigint_seen` where that can happen. With ``demo``, SIGINT is caught even where it came
    ignored (a job started by a background shell); otherwise an ignored SIGINT stays ignored.
    The previous handler and unraisable hook come back at the end.
    """
    before, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    if before is not _on_sigint:  # not nested in another watch: a new command
        _SEEN.clear()
    main_thread = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    if main_thread and (demo or before is not signal.SIG_IGN):
        signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = _unraisable
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, before)
        sys.unraisablehook = hook


def sigint_seen() -> bool:
    """Whether a Ctrl-C arrived while :func:`watch_sigint` was on (even if some code dropped its exception)."""
    return bool(_SEEN)


def end_interrupted() -> None:
    """End an interrupted command now, with status 130, once its line is written.

    A Ctrl-C that lands inside an import (numpy's, a dataclass's) sometimes leaves the interpreter
    ending the process by SIGINT after that line (status -2 instead of 130, seen in the start-up sweep
    of tests/integration/cli/test_console.py); nothing is left to do, so the process ends here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def interrupted(argv: list[str]) -> int:
    """``candle-ckpt``'s Ctrl-C answer for the command line ``argv``: one line on stderr; returns 130.

    Every command is safe to stop: reads change nothing, rollback is one atomic link move, and a
    prune stopped half-way leaves whole checkpoints (run it again to finish). The demo says what
    it saved (:func:`interrupted_demo`).
    """
    if argv[:1] == ["demo"]:
        return interrupted_demo(argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the process is ending: a second Ctrl-C changes nothing
    print(
        "candle-ckpt: error: interrupted; nothing is left half-done (run the command again to finish)", file=sys.stderr
    )
    return EXIT_INTERRUPTED


def interrupted_demo(argv: list[str]) -> int:
    """The demo's Ctrl-C answer: one line on stderr saying what was saved and how to resume; returns 130.

    ``argv`` are the demo's options (only ``--ckpt_directory`` is read). A second Ctrl-C while the
    line is written is ignored: the process is ending anyway.
    """
    import argparse

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    where_parser = argparse.ArgumentParser(add_help=False)
    where_parser.add_argument("--ckpt_directory", default=DEMO_DIRECTORY)
    where = os.path.abspath(where_parser.parse_known_args(argv)[0].ckpt_directory)
    print(f"\ndemo: interrupted; {saved_so_far(where)}; run the same command again to resume", file=sys.stderr)
    return EXIT_INTERRUPTED
