"""Whole lines from a child's pipe, each waited for at most a given time (the job servers' drivers).

Read straight from the descriptor into our own buffer: ``select()`` sees only what is
still in the pipe, not lines already pulled into a file object's buffer, so a
``readline()`` after a burst of lines would leave the rest unread until the child
wrote again (a test waiting out its silence bound for a line already read).
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator
from typing import IO


class PipeLines:
    """The lines of ``pipe`` (a child's stdout), one at a time."""

    def __init__(self, pipe: IO) -> None:
        self.fd, self.pending = pipe.fileno(), b""

    def next(self, timeout: float) -> str | None:
        """The next line without its newline, or None when none came within ``timeout`` seconds.

        Raises:
            EOFError: The pipe closed (the child exited) with no whole line left.
        """
        until = time.monotonic() + timeout
        while b"\n" not in self.pending:
            if not select.select([self.fd], [], [], max(0.0, until - time.monotonic()))[0]:
                return None
            got = os.read(self.fd, 1 << 16)
            if not got:
                raise EOFError
            self.pending += got
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode(errors="replace")

    def each(self, silence: float) -> Iterator[str]:
        """Every line until the pipe closes.

        Raises:
            TimeoutError: No line came for ``silence`` seconds (the child hangs: the caller kills it and fails).
        """
        while True:
            try:
                line = self.next(silence)
            except EOFError:
                return
            if line is None:
                raise TimeoutError(f"no line for {silence:.0f} s")
            yield line
