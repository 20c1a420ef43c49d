"""StoreGroup's cost, counted on a MemoryStore at N up to 64: O(N) calls per meeting, a bounded store, 0 after close.

The same protocol runs over JAX's and TensorFlow's coordination services (JaxStore, TfStore); the real
processes are counted in tests/integration/distributed/test_jax_protocol_counts.py at N = 2 and 4.
"""

from __future__ import annotations

import threading

import pytest

from candle_ckpt.core.errors import GroupTimeout
from candle_ckpt.core.group import ROOT, scoped
from candle_ckpt.testing.groups import ThreadGroup


def run(hub: ThreadGroup, work) -> list:
    """``work(member)`` on every rank, in threads; each rank's result (bounded)."""
    results: list = [None] * hub.size

    def one(member) -> None:
        results[member.rank] = work(member)

    threads = [threading.Thread(target=one, args=(m,), daemon=True) for m in hub.members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


@pytest.mark.parametrize("n", [2, 4, 16, 64])
def test_a_save_meeting_costs_about_3n_calls_and_the_store_stays_bounded(n: int) -> None:
    """A save's three meeting points (broadcast, all_agree, broadcast), 20 times: at most 5N + 3 calls per save
    in all, never more than 2N + 4 keys at once, and only the N scope counters once the scope is closed."""
    hub = ThreadGroup(n)
    peak = [0]

    def work(member) -> list[str]:
        group = scoped(member, "fit")
        said = []
        for _ in range(20):
            key = group.meeting("save")
            said.append(group.broadcast(f"{key}/work-ready", "ok" if group.rank == 0 else None, 30))
            group.all_agree(f"{key}/parts-written", True, 30)
            said.append(group.broadcast(f"{key}/committed", f"epochs/{key}" if group.rank == 0 else None, 30))
            peak[0] = max(peak[0], len(hub.store.keys(ROOT + "/")))
        group.close(30)
        return said

    before = sum(hub.store.calls.values())
    results = run(hub, work)
    assert all(r == results[0] for r in results) and results[0][1] == "epochs/save/0"
    calls = sum(hub.store.calls.values()) - before - n  # less the N scope counters' increments
    # Per save: two broadcasts (1 + N - 1 calls each) and a gathering meeting (N - 1 posts, N - 1 reads, one
    # outcome read by N - 1, three deletes): 5N + 3; the close: N - 1 posts, N - 1 reads, two deletes.
    assert calls <= 20 * (5 * n + 3) + 2 * n, hub.store.calls
    assert peak[0] <= 2 * n + 4 + n, peak  # the posts of one meeting, a few outcomes, the counters
    assert hub.store.keys(ROOT + "/") == sorted(f"{ROOT}/opened/{r}" for r in range(n))


def test_an_exchange_gives_every_rank_every_value_in_one_outcome() -> None:
    """exchange: N - 1 posts, N - 1 reads by the primary, one outcome read by each other rank (about 3N calls)."""
    hub = ThreadGroup(8)
    before = sum(hub.store.calls.values())
    results = run(hub, lambda m: m.exchange("why", f"r{m.rank}", 30))
    assert results == [[f"r{r}" for r in range(8)]] * 8
    assert sum(hub.store.calls.values()) - before <= 3 * 8 + 2, hub.store.calls


def test_a_rank_missing_at_a_gather_is_named_to_every_rank_that_came() -> None:
    """Rank 2 of 3 never comes: the primary and rank 1 both raise GroupTimeout naming rank 2 (not rank 0)."""
    hub = ThreadGroup(3)
    errors: list = [None] * 3

    def work(member) -> None:
        if member.rank == 2:
            return
        try:
            member.all_agree("save/0/parts-written", True, 0.3)
        except GroupTimeout as err:
            errors[member.rank] = err.missing

    run(hub, work)
    assert errors == [(2,), (2,), None]


def test_two_scopes_in_one_process_never_share_a_key() -> None:
    """scoped() twice on the same ranks (two callbacks, or a fit after a fit): distinct prefixes, agreed by all."""
    hub = ThreadGroup(2)
    prefixes = run(hub, lambda m: (scoped(m, "fit").prefix, scoped(m, "fit").prefix))
    assert prefixes[0] == prefixes[1] == (f"{ROOT}/1-fit", f"{ROOT}/2-fit")
