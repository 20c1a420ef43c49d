"""A hang in a multi-process job ends every process with 124, process 0 last.

In a JAX job process 0 hosts the coordination service: when it exits, every other process is ended by JAX at once
with its own fatal error (``SIGABRT``: 134 from a shell), and ``srun`` returns the highest status of its tasks, so
the job would end with 134, which the README's Slurm script does not requeue. So a process whose
:class:`~candle_ckpt.engine.watchdog.Watchdog` fires also tells the others (:meth:`HangNotice.tell`, before its
own report, so that theirs are written meanwhile), and a process
that has made no progress of its own (no step, save or meeting finished; bytes read, which the restore's watchdog
counts against its limit, do not count here) for a quarter of its limit, or of a meeting's bound where that is
shorter (``Watchdog._watch``), listens for that word at each of its watchdog's wake-ups
(:meth:`HangNotice.heard`: one read of the run's group, none while steps end); hearing it, it ends the same way.
The meeting's bound counts because a peer waiting at a meeting finds the hang at that bound
(``CANDLE_CKPT_GROUP_TIMEOUT_S``), whatever this process's own limit: with a long limit (``auto`` in a restore:
600 s) and a short bound, this one would listen only after process 0 had gone, and JAX would end it with 134.
Every process but 0 says that it leaves before it exits; process 0 waits for those words, at most
:data:`HANDOFF_S`, then exits. Meanwhile its training thread may fail (the peers of its collective left): the
interpreter's end then waits for the watchdog's exit, so that the status stays 124. A process stopped, or stuck
where no watchdog of ours runs (before ``restart()``), cannot answer: process 0 exits after :data:`HANDOFF_S` and
JAX ends that one.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from candle_ckpt.core.group import is_primary
from candle_ckpt.engine.group_commit import group_timeout

HANDOFF_S = 15.0  # process 0's wait, after its report, for the others to leave first: a wake-up (at most 5 s)
# and their report (at most REPORT_S, 10 s); when process 0 found the hang, theirs began beside its own
LISTEN = 0.25  # a process listens for a peer's hang once it made no progress for this share of its limit (or bound)
_SAID = "hang"  # the notice's name in the run's group: who found the hang
_LEFT = "hang-left"  # each process's word that it leaves (``hang-left/R``)


class HangNotice:
    """The word between the processes of ``group`` (a :class:`~candle_ckpt.core.group.Group` of more than one)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        # A meeting's bound: a peer waiting at one finds the hang after it. The watchdog listens once its run made no
        # progress for LISTEN x the shorter of its limit and this (read as an attribute at each wake-up, no call:
        # the walks count the modules a flow enters, docs/architecture.rst).
        self.bound = group_timeout()

    def heard(self) -> str | None:
        """Who found the job hung, if a peer said so (one read that does not wait); None otherwise."""
        with contextlib.suppress(Exception):  # a service that stopped answering is the watchdog's own limit's
            return self.group.heard(_SAID, 0.001)
        return None

    def tell(self, who: str) -> None:
        """This process found the hang: tell the others (``who``: its name). Said before its own report, so that
        theirs overlap it. Best effort."""
        with contextlib.suppress(Exception):
            self.group.notice(_SAID, who or f"process {self.group.rank}")

    def leave(self) -> None:
        """This process is about to exit with 124: say that it leaves (every process but 0), or wait for the
        others' words (process 0, at most :data:`HANDOFF_S`). Best effort: a store that fails ends the wait."""
        with contextlib.suppress(Exception):
            if not is_primary(self.group):
                self.group.notice(f"{_LEFT}/{self.group.rank}", "1")
                return
            deadline = time.monotonic() + HANDOFF_S
            for rank in range(1, self.group.size):
                left = max(0.001, deadline - time.monotonic())
                self.group.heard(f"{_LEFT}/{rank}", left)


__all__ = ["HANDOFF_S", "LISTEN", "HangNotice"]
