"""NoticeAgreement: nothing is said on a step unless a rank asked; then every rank saves at one step S.

Ranks are threads of a ThreadGroup (a MemoryStore that counts every call). What is proved here, for the
JAX and TensorFlow groups alike (they run the same StoreGroup protocol over their coordination services):

- a request on any rank, on two ranks at once, while another rank is mid-step, or from a rank's deadline,
  makes every rank save the same step S = max(steps passed when noticed) + 1, and every rank records who
  asked and why;
- steps with no request cost no store call at all (only the watcher's one blocking read per fit);
- after close, no key of the fit is left (only the per-rank scope counters of ``scoped``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import GroupTimeout
from candle_ckpt.core.group import ROOT, scoped
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.notice import NoticeAgreement
from candle_ckpt.engine.preempt import finish_preempted
from candle_ckpt.engine.preempt_control import PreemptionController
from candle_ckpt.testing.groups import ThreadGroup


class Store:
    layout = Layout.at("/nowhere")


class Engine:
    """What the run's end of a preemption save uses of a CheckpointEngine: finish, records, store, scratch_dir,
    preempt."""

    def __init__(self) -> None:
        self.saved: list[tuple[int, str]] = []
        self.records: list[dict] = []
        self.store, self.scratch_dir, self.preempt = Store(), None, None

    def save(self, step: int) -> Callable[[str], None]:
        return lambda reason: self.saved.append((step, reason))

    def finish(self) -> None:
        pass


def controller(cfg: CkptConfig, engine: Engine, agreement: NoticeAgreement) -> PreemptionController:
    """A controller over ``agreement`` whose ``on_saved`` ends the save on ``engine`` as the run does."""
    end = lambda saved: finish_preempted(saved, engine, cfg.preempt_exit_code, OpsLog(None))  # noqa: E731
    return PreemptionController(cfg, OpsLog(None), agreement=agreement, on_saved=end)


def run_job(size: int, steps: int, at_step: Callable[[int, int, PreemptionController], None], hub=None) -> dict:
    """Every rank runs ``steps`` steps (``at_step(rank, step, pre)`` before each); each rank's outcome.

    The ranks meet at each step, as the gradients' collective ties a real job's processes together.
    """
    hub = hub or ThreadGroup(size)
    collective = threading.Barrier(size, timeout=60)
    results: dict[int, dict] = {}
    cfg = CkptConfig.from_params({"ckpt_preempt_signals": "SIGUSR1", "ckpt_deadline": "none"})

    def rank(r: int) -> None:
        group = scoped(hub.members[r], "fit")
        engine = Engine()
        pre = controller(cfg, engine, NoticeAgreement(group, timeout_s=30))
        pre.arm()
        out: dict = {"code": None, "steps": 0}
        try:
            for step in range(1, steps + 1):
                collective.wait()
                at_step(r, step, pre)
                out["steps"] = step
                pre.step_end(0, step, engine.save(step))
        except SystemExit as exc:
            out["code"] = exc.code
        finally:
            pre.close()
            group.close(30)
        out.update(saved=engine.saved, record=engine.preempt, agreement=pre.agreement)
        results[r] = out

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert len(results) == size, results
    return results


def only_counters_left(hub: ThreadGroup) -> list[str]:
    """The keys left under candle_ckpt/, less the per-rank scope counters (which must be all that is left)."""
    return [k for k in hub.store.keys(ROOT + "/") if not k.startswith(f"{ROOT}/opened/")]


def assert_one_save_step(results: dict, requester: int, reason: str) -> int:
    """Every rank saved once, at the same step S, and records the requester and its reason; returns S."""
    saved = {r: out["saved"] for r, out in results.items()}
    (step,) = {s for r in saved for s, _ in saved[r]}
    assert all(len(v) == 1 for v in saved.values()), saved
    for r, out in results.items():
        assert out["record"]["reason"] == reason and out["record"]["step"] == step
        assert out["record"].get("requested_by") == (None if r == requester else requester)
        assert out["steps"] == step  # it stopped there: no rank ran past S
    return step


@pytest.mark.parametrize("asker", [0, 1, 2])
def test_a_request_on_any_rank_stops_every_rank_at_the_same_step(asker: int) -> None:
    """One rank's signal before its step 5: every rank saves one step S >= 5, records the signal, exits 143
    (the asker: 128 + SIGUSR1), and rank r's count when it noticed is at most S - 1."""
    hub = ThreadGroup(3)

    def at_step(r: int, step: int, pre: PreemptionController) -> None:
        if r == asker and step == 5:
            pre.watcher.trigger("SIGUSR1", signal.SIGUSR1)

    results = run_job(3, 40, at_step, hub)
    s = assert_one_save_step(results, asker, "SIGUSR1")
    assert s >= 5
    assert {r: out["code"] for r, out in results.items()} == {
        r: 128 + signal.SIGUSR1 if r == asker else 143 for r in range(3)
    }
    assert only_counters_left(hub) == []


def test_requests_on_two_ranks_at_once_are_one_agreement() -> None:
    """Ranks 1 and 2 both signalled at step 3: the first notice wins, one save step for all; each asker
    records its own signal, rank 0 the winner's."""
    hub = ThreadGroup(3)
    barrier = threading.Barrier(2)

    def at_step(r: int, step: int, pre: PreemptionController) -> None:
        if r in (1, 2) and step == 3:
            barrier.wait(10)
            pre.watcher.trigger("SIGUSR1", signal.SIGUSR1)

    results = run_job(3, 40, at_step, hub)
    steps = {out["saved"][0][0] for out in results.values()}
    assert len(steps) == 1 and all(len(out["saved"]) == 1 for out in results.values())
    winner = results[0]["record"]["requested_by"]
    assert winner in (1, 2)
    assert results[1]["record"].get("requested_by") is None and results[2]["record"].get("requested_by") is None
    assert only_counters_left(hub) == []


def test_a_request_while_another_rank_is_mid_step_waits_for_it() -> None:
    """Rank 2 is slow (sleeps in its step 4) when rank 0 asks at step 2: rank 2 is behind, yet all save one S,
    and no rank ran past it."""
    hub = ThreadGroup(3)

    def at_step(r: int, step: int, pre: PreemptionController) -> None:
        if r == 0 and step == 2:
            pre.watcher.trigger("SIGUSR1", signal.SIGUSR1)
        if r == 2 and step == 4:
            time.sleep(0.5)

    results = run_job(3, 200, at_step, hub)
    assert_one_save_step(results, 0, "SIGUSR1")
    assert only_counters_left(hub) == []


def test_a_deadline_on_one_rank_stops_every_rank() -> None:
    """Rank 1's deadline comes at its step 7 (no signal): every rank saves one S with the reason 'deadline'."""
    hub = ThreadGroup(2)

    def at_step(r: int, step: int, pre: PreemptionController) -> None:
        if r == 1 and step == 7:
            pre.watcher.deadline = time.time() - 1.0

    results = run_job(2, 60, at_step, hub)
    s = assert_one_save_step(results, 1, "deadline")
    assert s >= 7 and results[0]["code"] == results[1]["code"] == 143


def test_steps_without_a_request_make_no_store_call_and_close_leaves_no_key() -> None:
    """300 steps on 4 ranks, no request: the only calls during the steps are each watcher's one blocking read;
    close meets in O(N) calls, and leaves nothing but the 4 scope counters."""
    hub = ThreadGroup(4)
    seen: dict[str, int] = {}

    def at_step(r: int, step: int, pre: PreemptionController) -> None:
        if step == 2 and r == 0:
            deadline = time.monotonic() + 30
            while hub.store.calls["get"] < 4 and time.monotonic() < deadline:  # every watcher is blocked
                time.sleep(0.01)
            seen["before"] = sum(hub.store.calls.values())
        if step == 299 and r == 0:  # no rank can be past the collective of step 300 yet
            seen["after"] = sum(hub.store.calls.values())

    results = run_job(4, 300, at_step, hub)
    assert all(out["saved"] == [] and out["code"] is None for out in results.values())
    assert all(out["agreement"].stop_at is None for out in results.values())
    assert seen["after"] - seen["before"] == 0, seen
    assert sorted(hub.store.keys(ROOT + "/")) == [f"{ROOT}/opened/{r}" for r in range(4)]
    # The whole fit: 4 counter increments, 4 watcher reads, the close notices and two O(N) meetings.
    assert sum(hub.store.calls.values()) <= 8 * 4 + 10, hub.store.calls


def test_a_rank_that_never_comes_makes_the_others_raise_group_timeout_naming_it() -> None:
    """Rank 1 never starts its watcher: rank 0's request ends in GroupTimeout naming rank 1 (bounded)."""
    hub = ThreadGroup(2)
    cfg = CkptConfig.from_params({"ckpt_preempt_signals": "SIGUSR1", "ckpt_deadline": "none"})
    pre = controller(cfg, Engine(), NoticeAgreement(scoped(hub.members[0], "fit"), timeout_s=0.3))
    pre.arm()
    pre.watcher.trigger("SIGUSR1", signal.SIGUSR1)
    with pytest.raises(GroupTimeout, match=r"'stop' within 0.3 s \(rank\(s\) 1 never came\)"):
        pre.step_end(0, 1, Engine().save(1))
    pre.close(ended=False)


def test_a_signal_is_told_at_once_not_at_the_askers_next_step_end() -> None:
    """A signal handler's request() posts the notice from a thread: the other ranks notice it while the asking
    rank is still inside its step 5 (it waits there until they have), and all save step 5 or 6."""
    hub = ThreadGroup(3)
    agreements: dict[int, NoticeAgreement] = {}

    def at_step(r: int, step: int, pre: PreemptionController) -> None:
        agreements[r] = pre.agreement
        if r == 1 and step == 5:
            pre.watcher.trigger("SIGUSR1", signal.SIGUSR1)
            pre.agreement.request("SIGUSR1")  # what the signal handler does (PreemptionWatcher.on_signal)
            deadline = time.monotonic() + 30
            while not all(agreements[q].noticed for q in (0, 2)) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert all(agreements[q].noticed for q in (0, 2)), "the notice waited for the asker's step end"

    results = run_job(3, 40, at_step, hub)
    assert assert_one_save_step(results, 1, "SIGUSR1") in (5, 6)
    assert only_counters_left(hub) == []
