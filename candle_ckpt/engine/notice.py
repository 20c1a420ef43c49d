"""The notice agreement: how the processes of one job learn, at the same step, that one of them must stop.

Split from the controller (:mod:`candle_ckpt.engine.preempt_control`), which asks it after every step and
epoch end. :data:`SOLO` is one process; :class:`NoticeAgreement` serves every group (JAX's coordination
service, TensorFlow's under ``MultiWorkerMirroredStrategy``, threads in a test) through two verbs of the
:class:`~candle_ckpt.core.group.Group`: :meth:`~candle_ckpt.core.group.Group.notice` (said once for the whole
group, the first one wins) and :meth:`~candle_ckpt.core.group.Group.heard` (wait for it), and says nothing on
a step unless some rank asked to stop.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from candle_ckpt.core.errors import GroupTimeout

NOTICE = "notice"  # the one notice of an agreement's lane


class Agreement(Protocol):
    """How the processes of one job learn, at the same call, whether any of them must stop.

    The whole notice between processes is this protocol: the controller calls nothing else, and
    :class:`NoticeAgreement` says it through the Group's verbs only (no store key of its own).
    """

    #: ``(rank, reason)`` of the process that asked, the same on every process once agreed; else None.
    requested: tuple[int, str] | None

    def start(self) -> None: ...  # a fit begins

    def request(self, reason: str) -> None: ...  # this process was asked (from a signal handler: sets a flag only)

    # ``local``: this process's request, its reason (or True), or a false value.
    def step_end(self, local: bool | str | None) -> bool: ...  # called after every step (may talk only every k-th)

    def now(self, local: bool | str | None) -> bool: ...  # agree at once

    def stats(self) -> dict[str, Any]: ...

    def close(self, meet: bool = True) -> None: ...  # the fit ended (``meet``: alike on every process)


class _Solo:
    """One process: its own flag is the answer."""

    requested = None

    def start(self) -> None:
        """Nothing to start."""

    def request(self, reason: str) -> None:
        """No one else to tell: the flag is read at the next step end."""

    def close(self, meet: bool = True) -> None:
        """Nothing to end."""

    def step_end(self, local: bool | str | None) -> bool:
        return bool(local)

    def now(self, local: bool | str | None) -> bool:
        return bool(local)

    def stats(self) -> dict[str, Any]:
        return {}


SOLO: Agreement = _Solo()


class NoticeAgreement:
    """An :class:`Agreement` over a ``Group``: nothing is said on a step unless some rank asked to stop.

    The protocol (as TensorFlow's ``PreemptionCheckpointHandler`` and JAX's preemption sync point):

    - each rank runs a watcher thread that blocks on one key of the group's store, ``notice``;
    - a rank whose own request comes sets ``notice`` once, with its rank and reason: a signal at once, from
      a thread the signal handler wakes (:meth:`request`), a deadline from the training thread at its step
      end; the first writer of the job wins, and every watcher wakes;
    - each watcher then sets :attr:`noticed` and reads :attr:`count` (points passed: steps and epoch ends)
      under one lock, and the ranks ``exchange`` their counts once (O(N) messages): the save point is
      ``S = max + 1``, the same on every rank (the asking rank's training thread, which waits at the point
      where it asked, counts as having noticed just before it: with its peers behind it in the step's
      collective, ``S`` is the very step it asked at);
    - the training thread's cost per point is ``count += 1`` and a flag read under that lock. Once it sees
      :attr:`noticed` it waits (bounded) for its watcher to learn ``S``, then runs on to point ``S`` and
      answers True there. This cannot deadlock: the counts are exchanged by the watcher threads, never the
      training threads, and every training thread stops at a point <= ``S`` (its count was read before,
      or as, it saw the flag).

    :meth:`close` sets ``notice`` to ``closed`` (if no one asked): the watchers still agree on a point, past
    every rank's last, so a request that raced with the end of training is answered by none, and no rank
    waits for one that has gone. :attr:`requested` is ``(rank, reason)`` of the rank that asked, the same
    on every rank, so every process records the real reason, not just "peer".

    Args:
        group: The processes (a :class:`~candle_ckpt.core.group.Group`; one rank: the local flag answers).
        timeout_s: Bound on the agreement; GroupTimeout names the ranks that did not come.
    """

    CLOSED = "closed"

    def __init__(self, group: Any, timeout_s: float = 300.0) -> None:
        self.group, self.timeout_s = group, float(timeout_s)
        self.requested: tuple[int, str] | None = None
        self.stop_at: int | None = None  # S, once agreed (None: not yet, or never: the notice was a close)
        self.agree_s = 0.0
        self.count, self.noticed, self._noticed_at = 0, False, 0
        self._lock = threading.Lock()
        self._decided = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._posted = False
        self._reason = "request"
        self._asked = threading.Event()
        self._lane: Any = None
        self._thread: threading.Thread | None = None

    @property
    def multi(self) -> bool:
        return self.group.size > 1

    def start(self) -> None:
        """At the start of a fit: a fresh lane of the group and its watcher thread (several ranks only)."""
        self.requested, self.stop_at, self.agree_s, self.count, self.noticed = None, None, 0.0, 0, False
        self._decided.clear()
        self._stop.clear()
        self._error, self._posted = None, False
        if not self.multi:
            return
        self._lane = self.group.lane(self.group.meeting("preempt"))
        self._asked = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="candle_ckpt-preempt-watch", daemon=True)
        self._thread.start()
        threading.Thread(target=self._tell, args=(self._lane, self._asked), name="candle_ckpt-preempt-tell",
                         daemon=True).start()  # fmt: skip

    def request(self, reason: str) -> None:
        """This process's request, from a signal handler: posted at once by a thread (not at the next step end).

        Every watcher then notices it while the training threads are still inside their steps, so ``S`` is
        the next step of the slowest of them. Safe in a signal handler: it only sets an event.
        """
        self._reason = reason
        self._asked.set()

    def _tell(self, lane: Any, asked: threading.Event) -> None:
        """The thread that posts a request :meth:`request` recorded (it waits for nothing else)."""
        while not asked.wait(self.timeout_s):
            if self._stop.is_set():
                return
        if not self._stop.is_set():
            self._post(lane, self._reason)

    def _post(self, lane: Any, reason: str) -> None:
        """Set ``notice`` once from this process (the first writer of the job wins; every watcher wakes)."""
        with self._lock:
            if self._posted:
                return
            self._posted = True
        lane.notice(NOTICE, f"{self.group.rank}:{reason}")

    def _watch(self) -> None:
        """The watcher thread: wait for ``notice``, then agree on ``S`` with the other watchers."""
        lane = self._lane  # its own: close() lets go of the agreement's
        said = None
        while said is None:
            if self._stop.is_set():
                return
            said = lane.heard(NOTICE, self.timeout_s)
        began = time.perf_counter()
        rank, _, reason = said.partition(":")
        with self._lock:
            if not self.noticed:
                self.noticed, self._noticed_at = True, self.count
            count = self._noticed_at
        try:
            counts = lane.exchange("stop", str(count), self.timeout_s)
            if reason != self.CLOSED:
                self.requested = (int(rank), reason)
                self.stop_at = max(int(c) for c in counts) + 1
        except Exception as err:  # handed to the training thread, which raises it
            self._error = err
        self.agree_s = time.perf_counter() - began
        self._decided.set()

    def _wait(self) -> None:
        if not self._decided.wait(self.timeout_s * 1.2 + 5.0):
            raise GroupTimeout("preempt/stop", self.timeout_s)
        if self._error is not None:
            raise self._error

    def step_end(self, local: bool | str | None) -> bool:
        """One point passed (a step, or an epoch end); True at the agreed point ``S`` (see the class docstring)."""
        with self._lock:
            self.count += 1
            count, noticed = self.count, self.noticed
        if not (noticed or local):
            return False
        if not self.multi:
            return True
        if local and not self._posted:  # a deadline (a signal was posted by request() already, as a rule)
            with self._lock:  # this thread waits at this point: as if it had noticed just before it
                if not self.noticed:
                    self.noticed, self._noticed_at = True, count - 1
            self._post(self._lane, local if isinstance(local, str) else "request")
        self._wait()
        return self.stop_at is not None and count >= self.stop_at

    now = step_end  # an epoch end is a point like a step

    def close(self, meet: bool = True) -> None:
        """At the end of a fit: answer any request still open (``meet``), stop the watcher, delete the lane.

        Without ``meet`` (a fit that failed) nothing is said: the watcher is only told to stop.
        """
        lane, self._lane = self._lane, None
        if lane is not None and meet:
            # The watcher must still read this (or the request it races with): stopped only after.
            lane.notice(NOTICE, f"{self.group.rank}:{self.CLOSED}")
            try:
                self._wait()
            except Exception:  # a rank that died: the job is over, and the training has seen the error
                lane = None
        self._stop.set()
        if self.multi:
            self._asked.set()  # the teller thread wakes, sees the stop, and ends
        if lane is not None and meet:
            lane.close(self.timeout_s)

    def stats(self) -> dict[str, Any]:
        return {"agree_s": round(self.agree_s, 6), "stop_at": self.stop_at, "points": self.count}


__all__ = ["SOLO", "Agreement", "NoticeAgreement"]
