"""``ckpt.log``: the operations log of a checkpoint directory, plus console logging and the stats record.

Lines are appended with a timestamp and flushed at once, so the log survives
a kill. Console output goes through ``logging.getLogger("candle_ckpt")``; the
console handler is added at most once, however many callbacks are created
(CANDLE added one per callback).

A console record always starts on a line of its own: while ``fit`` runs, the
callback wraps ``sys.stdout`` in a :class:`LineTracker` (:func:`track_stdout`),
and the console handler ends Keras's unterminated progress-bar line first.

Every ``stats()`` the library reports (a save, a restore, a partial load, an
upload) is one record made here (:func:`transfer_record`), so the rounding and
the MB/s arithmetic are the same everywhere, in ``stats()`` and in the log's
lines: durations to the microsecond, MB/s (10^6 bytes) to three places, over
the sum of the durations (never divided by zero).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from candle_ckpt.config.params import take_unreported

ROOT_LOGGER = "candle_ckpt"
QUIET_LOGGER = "candle_ckpt.quiet"  # verbose=False: warnings only on the console
_HANDLER_MARK = "_candle_ckpt_console"


def get_logger(logger: str | logging.Logger | None = "DEFAULT", verbose: bool = True) -> logging.Logger | None:
    """Resolve CANDLE's ``logger`` argument.

    ``"DEFAULT"`` gives the ``candle_ckpt`` logger, with one console handler
    when ``verbose``; with ``verbose=False`` it gives its child
    ``candle_ckpt.quiet``, set to WARNING, so that object's progress lines stay
    off the console even when another object (``restart()`` defaults to
    ``verbose=True``) added the handler, while its warnings still show. A
    :class:`logging.Logger` is used as is; None disables console logging.
    ``ckpt.log`` always gets every INFO line, whatever ``verbose`` says (as in CANDLE).
    """
    if logger is None:
        return None
    if isinstance(logger, logging.Logger):
        return logger
    if logger != "DEFAULT":
        raise TypeError(f"logger must be 'DEFAULT', a logging.Logger or None; got {logger!r}")
    if not verbose:
        quiet = logging.getLogger(QUIET_LOGGER)
        if quiet.level == logging.NOTSET:  # a level the user chose is kept
            quiet.setLevel(logging.WARNING)
        return quiet
    log = logging.getLogger(ROOT_LOGGER)
    if not any(getattr(h, _HANDLER_MARK, False) for h in log.handlers):
        handler = ConsoleHandler()
        setattr(handler, _HANDLER_MARK, True)
        log.addHandler(handler)
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)
    return log


def human_bytes(n: float | None) -> str:
    """``n`` bytes in a readable decimal unit: ``512 B``, ``42.7 kB``, ``1.3 MB``, ``2.0 GB``."""
    if n is None:
        return "?"
    if n < 1000:
        return f"{int(n)} B"
    value, unit = n / 1000, "kB"
    for bigger in ("MB", "GB", "TB"):
        if value < 999.95:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in the right number: ``1 checkpoint``, ``2 checkpoints``, ``0 files``.

    ``plural`` for a noun that does not take an ``s`` (``counted(2, "process", "processes")``). Every
    line that counts something says it through here, so none reads "1 checkpoints".
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def position(epoch: int, step: int | None = None) -> str:
    """Where in training a checkpoint was taken, in Keras's 1-based epochs (what ``fit`` prints):
    ``epoch 20`` after 20 completed epochs, ``epoch 21, step 1`` after step 1 of the 21st.

    ``epoch`` and ``step`` are the sidecar's fields (completed epochs; steps done of the next one).
    The log, ``candle-ckpt list``, ``info`` and ``verify`` all name a checkpoint through here.
    """
    return f"epoch {epoch}" if step is None else f"epoch {epoch + 1}, step {step}"


class SaidOnce:
    """Passes each message to ``say`` the first time only: a warning repeated every epoch is noise.

    Call it with the message (``warn_once = SaidOnce(log.warning)``; ``warn_once("...")``). It keeps the
    messages it has said, for the life of the object that owns it (one ``fit``'s state, one callback).
    """

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._said: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self._say(message)


class LineTracker:
    """A stand-in for ``sys.stdout`` that remembers whether its last line is unterminated.

    ``lock`` orders writes: the console handler holds it from ending the line to
    writing its record, so a progress bar drawn by the training thread meanwhile
    (the async saver logs from its own thread) cannot slip in between.
    """

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream
        self.mid_line = False
        self.lock = threading.RLock()  # re-entrant: a record's own write may come back through sys.stdout

    def write(self, text: str) -> int:
        with self.lock:
            written = self.wrapped.write(text)
            if text:
                self.mid_line = not text.endswith("\n")
            return written

    def end_line(self) -> None:
        """Terminate an open line (a progress bar) so that what follows starts on its own; flush what is written."""
        with self.lock:
            if self.mid_line:
                self.write("\n")
            self.wrapped.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def track_stdout() -> LineTracker:
    """Wrap ``sys.stdout`` in a :class:`LineTracker` (or return the one already there)."""
    if not isinstance(sys.stdout, LineTracker):
        sys.stdout = LineTracker(sys.stdout)
    return sys.stdout


def untrack_stdout(tracker: LineTracker | None) -> None:
    """Put back what :func:`track_stdout` wrapped, unless someone replaced ``sys.stdout`` since."""
    if tracker is not None and sys.stdout is tracker:
        sys.stdout = tracker.wrapped


class ConsoleHandler(logging.StreamHandler):
    """The console handler: a record never continues Keras's progress-bar line."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s candle_ckpt %(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        out = sys.stdout
        if not isinstance(out, LineTracker):
            super().emit(record)
            return
        with out.lock:  # no progress text between the line's end and the record
            try:
                out.end_line()
            except (OSError, ValueError):  # a closed stdout must not lose the record
                pass
            super().emit(record)


class OpsLog:
    """Appends to ``<ckpt_directory>/ckpt.log`` and mirrors to a logger."""

    def __init__(self, path: str | None, logger: logging.Logger | None = None) -> None:
        # path None: the logger only (a non-chief worker must not append to the chief's ckpt.log).
        self.path = path
        self.logger = logger
        self._lock = threading.Lock()
        for message in take_unreported():  # an unknown ckpt_* key of the dict this object was built from
            self.warning(message)

    def write(self, message: str, level: int = logging.INFO, console: bool = True) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        line = f"{stamp} {logging.getLevelName(level)} {message}\n"
        if self.path is not None:
            with self._lock:
                try:
                    os.makedirs(os.path.dirname(self.path), exist_ok=True)
                    with open(self.path, "a", encoding="utf-8") as f:
                        f.write(line)
                except OSError as err:  # a full disk must not turn a log line into a crash
                    self._unwritten(err)
        if self.logger is not None:
            self.logger.log(level if console else logging.DEBUG, message)

    def _unwritten(self, err: OSError) -> None:
        """Say that a line could not be appended: a warning for a disk that fails (full, I/O error).

        A directory that cannot hold ckpt.log at all (not writable, a file in its place) is said once, by
        the store that opens it for writing, which names that cause; a warning here would come first and
        name a consequence. The line itself still reaches the console logger.
        """
        level = logging.DEBUG if isinstance(err, (PermissionError, FileExistsError, NotADirectoryError)) else None
        if level is None and err.errno == errno.EROFS:
            level = logging.DEBUG
        logging.getLogger(ROOT_LOGGER).log(level or logging.WARNING, "cannot append to %s: %s", self.path, err)

    def info(self, message: str) -> None:
        self.write(message, logging.INFO)

    def note(self, message: str) -> None:
        """An INFO line for ``ckpt.log`` only (the logger gets it at DEBUG): what every run says."""
        self.write(message, logging.INFO, console=False)

    def warning(self, message: str) -> None:
        self.write(message, logging.WARNING)

    def error(self, message: str) -> None:
        self.write(message, logging.ERROR)


# -- the statistics record of a transfer ----------------------------------------------------------------------
_TINY = 1e-9  # the shortest duration divided by: an instant transfer is fast, not infinite


def seconds(value: float) -> float:
    """Round a duration the way every record reports it (to the microsecond)."""
    return round(value, 6)


def mb_per_s(nbytes: int, elapsed: float) -> float:
    """Throughput in MB/s (10^6 bytes per second) of ``nbytes`` moved in ``elapsed`` seconds, rounded."""
    return round(nbytes / max(elapsed, _TINY) / 1e6, 3)


def transfer_record(nbytes: int, what: dict[str, Any] | None = None, **durations: float) -> dict[str, Any]:
    """Return ``{**what, "bytes", <each duration>, "mb_per_s"}``, in that order.

    Args:
        nbytes: The bytes moved.
        what: What was moved (``epoch``, ``file``, ``url``...), first in the record.
        durations: The named durations in seconds (``verify_s=...``, ``load_s=...``);
            MB/s is over their sum.
    """
    record = dict(what or {})
    record["bytes"] = nbytes
    record.update({name: seconds(value) for name, value in durations.items()})
    record["mb_per_s"] = mb_per_s(nbytes, sum(durations.values()))
    return record
