"""GroupPreemptAgreement: a request on any one rank of a group becomes the same request on every rank."""

from __future__ import annotations

import threading
import time

from candle_ckpt.core.group import ThreadGroup, ThreadMember
from candle_ckpt.distributed.group_preempt import GroupPreemptAgreement
from candle_ckpt.engine.preempt import Trigger


class ExchangeMember(ThreadMember):
    """A thread rank that also has JaxGroup's ``exchange`` (every rank's value, in rank order)."""

    def exchange(self, name: str, value: str, timeout_s: float) -> list[str]:
        seen = self.hub._meet(name, self.rank, value, timeout_s, set(range(self.size)))
        return [str(seen[r]) for r in range(self.size)]


def _run(
    requests: list[Trigger | None], every: int = 1, calls: int = 1, exchange: bool = True
) -> list[list[Trigger | None]]:
    """Each rank (a thread) calls its agreement ``calls`` times with its request; what each got back."""
    hub = ThreadGroup(len(requests))
    if exchange:
        hub.members = tuple(ExchangeMember(hub, rank) for rank in range(len(requests)))
    out: list[list[Trigger | None]] = [[] for _ in requests]

    def rank(i: int) -> None:
        agree = GroupPreemptAgreement(hub.members[i], every, timeout_s=20, prefix="t")  # threads: one name
        for _ in range(calls):
            out[i].append(agree(requests[i]))

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_a_signal_on_one_rank_reaches_every_rank_with_its_reason():
    """SIGTERM caught by rank 1 only: ranks 0 and 1 both answer SIGTERM at the same call."""
    sigterm = Trigger("SIGTERM", 15, time.monotonic(), time.time())
    got = _run([None, sigterm])
    assert [g[0].reason if g[0] else None for g in got] == ["SIGTERM", "SIGTERM"]
    assert got[1][0] is sigterm


def test_a_group_without_exchange_still_saves_everywhere_at_once():
    """Through barrier/broadcast only: every rank answers at the same call; the rank that asked keeps its reason."""
    sigterm = Trigger("SIGTERM", 15, time.monotonic(), time.time())
    got = _run([None, sigterm], exchange=False)
    assert got[1][0] is sigterm and got[0][0] is not None and got[0][0].reason == "peer"


def test_no_request_anywhere_is_no_request():
    """Nobody asked: every rank gets None."""
    assert _run([None, None, None]) == [[None], [None], [None]]


def test_between_checks_nobody_saves():
    """With every=2 the first call exchanges nothing and returns None on every rank; the second agrees."""
    sigterm = Trigger("SIGTERM", 15, time.monotonic(), time.time())
    got = _run([sigterm, None], every=2, calls=2)
    assert [g[0] for g in got] == [None, None]
    assert [g[1].reason for g in got] == ["SIGTERM", "SIGTERM"]
