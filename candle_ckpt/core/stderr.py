"""TensorFlow's start-up lines kept out of what the library itself starts.

TensorFlow 2.21 writes a set of lines to file descriptor 2 from its C++ code while it loads, before
absl's logging is initialised (so ``TF_CPP_MIN_LOG_LEVEL`` does not reach them), once for each of its
two shared libraries: the set comes twice. A job on the JAX or torch backend with TensorFlow installed
loads it inside Keras's ``.keras`` serialization, at the first save: those lines then appear in the middle
of training, written by a save of ours. :func:`tf_startup_lines_dropped` runs such a body with
descriptor 2 pointed at a temporary file, then writes back everything but those lines (another thread's
output is delayed, never lost; all of it comes back if the body raises).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator

# A line absl writes before its logging is initialised: the notice itself, and "I0000 00:00:<seconds>  <tid>
# file.cc:N] ..." (month and day 0000: the date is not known yet), with the CPU-instructions line's second line.
STARTUP_LINE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWEF]0000 00:00:[\d.]+ +\d+ [\w.]+:\d+\] .*"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\."
)


def without_startup_lines(text: str) -> str:
    """``text`` less the lines TensorFlow writes while it loads (:data:`STARTUP_LINE`)."""
    return "".join(line for line in text.splitlines(keepends=True) if not STARTUP_LINE.fullmatch(line.rstrip("\n")))


@contextlib.contextmanager
def descriptor_2_captured(write_back: Callable[[str, BaseException | None], str]) -> Iterator[None]:
    """Run the body with file descriptor 2 pointed at a temporary file; then write ``write_back(text, error)``
    to it, ``error`` being what the body raised (or None). What other threads wrote meanwhile is delayed."""
    sys.stderr.flush()
    saved = os.dup(2)
    error: BaseException | None = None
    with tempfile.TemporaryFile() as hidden:
        os.dup2(hidden.fileno(), 2)
        try:
            yield
        except BaseException as err:
            error = err
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            hidden.seek(0)
            text = write_back(hidden.read().decode("utf-8", "replace"), error)
            if text:
                os.write(2, text.encode())


@contextlib.contextmanager
def tf_startup_lines_dropped() -> Iterator[None]:
    """Run the body with TensorFlow's start-up lines dropped from file descriptor 2, the rest written back.

    Nothing is done once TensorFlow is loaded (it has said its lines), or when ``TF_CPP_MIN_LOG_LEVEL`` is 0:
    a user who set it asked for all of TensorFlow's logs (1 proves nothing: ``import jax`` sets it to 1).
    """
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        yield
        return
    with descriptor_2_captured(lambda text, error: text if error is not None else without_startup_lines(text)):
        yield
