"""The hang watchdog's rule and its report, with a fake exit (no process ends here)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from module_walk import Walk

from candle_ckpt.core import history
from candle_ckpt.core.errors import GroupTimeout
from candle_ckpt.engine.watchdog import (
    FLOOR_S,
    HANG_EXIT,
    START_S,
    ReadMeter,
    Watchdog,
    WatchedGroup,
    auto_limit,
    watched,
)
from candle_ckpt.testing.groups import ThreadGroup


def test_auto_judges_nothing_before_the_first_step_but_by_the_start_floor():
    """Before the first step ended, auto's limit is START_S whatever the phase."""
    assert auto_limit("step", None, {}) == START_S
    assert auto_limit("input", None, {"step": 30.0}) == START_S


@pytest.mark.parametrize("phase", ["restore", "open"])
def test_auto_judges_our_own_work_outside_a_run_by_the_start_floor(phase):
    """restart()'s restore and the directory's opening are judged by START_S under auto, whatever was seen."""
    assert auto_limit(phase, None, {}) == START_S
    assert auto_limit(phase, 5.0, {"step": 1.0}) == START_S


def test_watched_work_that_stops_is_ended_in_its_phase_and_finished_work_ends_nothing(tmp_path):
    """watched() (the opening's and the restore's watchdog): an opening with no byte moving is reported in phase
    open and ended 124 (a fake exit here); one that returns in time leaves nothing armed."""
    ended: list[int] = []
    log = tmp_path / "ckpt.log"
    with watched(0.5, str(log), "open", exit=ended.append) as dog:
        assert dog.now() == "open" and dog.limit() == 0.5
        _wait(ended, 10.0)
    assert ended == [HANG_EXIT]
    assert "in phase open (opening the checkpoint directory: its writer lock and checks)" in log.read_text()
    ended.clear()
    with watched(0.5, str(tmp_path / "quiet.log"), "open", exit=ended.append):
        pass
    time.sleep(1.0)
    assert ended == [] and not (tmp_path / "quiet.log").exists()
    with watched(None, str(log), "open") as off:  # ckpt_hang_timeout=none: no thread
        assert not off.on


def test_a_restore_that_never_returns_is_reported_in_phase_restore(tmp_path):
    """A watchdog armed in phase restore (engine/restore.py's) with no progress: phase restore named, ended 124;
    disarmed in time, it ends nothing."""
    dog, ended = _dog(tmp_path, 0.5)
    dog.arm("restore")
    assert dog.now() == "restore" and dog.limit() == 0.5
    _wait(ended, 10.0)
    assert ended == [HANG_EXIT]
    assert "in phase restore (restart() choosing, verifying or reading" in (tmp_path / "ckpt.log").read_text()
    (record,) = history.read_local(str(tmp_path / "restarts.jsonl"))
    assert record["phase"] == "restore"
    quiet, ended = _dog(tmp_path / "quiet", 0.5)
    quiet.arm("restore")
    quiet.disarm()
    time.sleep(1.0)
    assert ended == []


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="Linux's /proc/self/io")
def test_the_read_meter_counts_bytes_read_and_not_its_own(tmp_path):
    """Two readings with nothing read between are equal (the meter's own reads of /proc/self/io are not
    counted); a 1 MB file written, then read, between them moves it by at least 1 MB each time."""
    meter = ReadMeter()
    quiet = [meter() for _ in range(5)]
    assert len(set(quiet)) == 1 and quiet[0] is not None, quiet
    path = tmp_path / "data.bin"
    before = meter()
    path.write_bytes(os.urandom(1 << 20))
    assert meter() - before >= 1 << 20
    before = meter()
    assert len(path.read_bytes()) == 1 << 20
    assert meter() - before >= 1 << 20


def test_a_read_that_moves_is_progress_in_the_restore(tmp_path):
    """A restore watchdog whose probe keeps moving (a long read) does not fire past its limit; once the probe
    stops (the read hangs), it fires within the limit and a wake-up."""
    ticks = [0]
    ended: list[int] = []
    dog = Watchdog(1.5, str(tmp_path / "ckpt.log"), None, exit=ended.append, moving=lambda: ticks[0])
    dog.arm("restore")
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:  # three times the limit, moving
        ticks[0] += 1
        time.sleep(0.02)
    assert ended == []
    stopped = time.monotonic()
    _wait(ended, 10.0)
    assert ended == [HANG_EXIT] and time.monotonic() - stopped < 1.5 + 5.0
    assert "in phase restore" in (tmp_path / "ckpt.log").read_text()


def test_auto_at_the_defaults_ends_a_hang_within_two_minutes():
    """With a 20 s first step (the compile) and 1 s steps, auto's limit is the 60 s floor, under 2 minutes."""
    limit = auto_limit("input", 20.0, {"step": 1.0})
    assert limit == FLOOR_S and limit + 5.0 < 120.0


def test_auto_scales_with_the_observed_intervals():
    """5 x the longest interval of the phase's kind; twice the first step; an unseen kind takes the longest seen."""
    assert auto_limit("step", 10.0, {"step": 30.0}) == 150.0
    assert auto_limit("step", 50.0, {"step": 1.0}) == 100.0
    assert auto_limit("save", 5.0, {"step": 20.0}) == 100.0  # no save seen yet: the longest of any kind
    assert auto_limit("save", 5.0, {"step": 20.0, "save": 2.0}) == FLOOR_S


def _dog(tmp_path, timeout, where=None):
    ended: list[int] = []

    def record_failure(error: str, phase: str) -> None:  # as the run's restart history records it
        history.append_local(str(tmp_path / "restarts.jsonl"), history.new_record("failure", error=error, phase=phase))

    dog = Watchdog(
        timeout, str(tmp_path / "ckpt.log"), record_failure, who="process 1 of 2", where=where, exit=ended.append
    )
    return dog, ended


def _wait(ended: list[int], bound: float) -> None:
    deadline = time.monotonic() + bound
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_run_without_progress_is_reported_and_ended_with_124(tmp_path):
    """No beat for longer than the limit: ckpt.log names the phase and holds every thread's stack, the history
    gets a failure record with the phase, and the exit is HANG_EXIT."""
    dog, ended = _dog(tmp_path, 0.5, where=lambda: "input")
    dog.arm()
    dog.beat()
    _wait(ended, 10.0)
    assert ended == [HANG_EXIT]
    log = (tmp_path / "ckpt.log").read_text()
    assert "hang: process 1 of 2 made no progress" in log and "in phase input" in log, log
    assert "exiting with status 124" in log and 'File "' in log and "Thread 0x" in log, log
    (record,) = history.read_local(str(tmp_path / "restarts.jsonl"))
    assert record["event"] == "failure" and record["error"] == "hang" and record["phase"] == "input"


def test_steady_progress_is_never_a_hang(tmp_path):
    """Beats more often than the limit keep the run alive; disarm stops the watching."""
    dog, ended = _dog(tmp_path, 0.6)
    dog.arm()
    for _ in range(30):
        time.sleep(0.05)
        dog.beat()
    dog.disarm()
    time.sleep(1.0)
    assert ended == []
    assert not (tmp_path / "ckpt.log").exists()


def test_a_save_that_hangs_is_named_save(tmp_path):
    """Inside phase_of("save") (on the training thread) the hang's phase is save, not the probe's answer."""
    dog, ended = _dog(tmp_path, 0.5, where=lambda: "input")
    dog.arm()
    dog.beat()
    with dog.phase_of("save"):
        _wait(ended, 10.0)
    assert ended == [HANG_EXIT]
    assert "in phase save" in (tmp_path / "ckpt.log").read_text()


def test_meetings_of_the_watched_group_are_phase_meeting(tmp_path):
    """A rank that waits at a meeting of the watched group is in phase meeting; a finished meeting is progress."""
    dog, ended = _dog(tmp_path, 0.5)
    group = WatchedGroup(ThreadGroup(2).members[0], dog)
    dog.arm()
    dog.beat()
    with pytest.raises(GroupTimeout, match="rank"):
        group.barrier("b", 1.5)  # rank 1 never comes
    _wait(ended, 10.0)
    assert ended == [HANG_EXIT]
    assert "in phase meeting" in (tmp_path / "ckpt.log").read_text()


def test_off_means_no_thread(tmp_path):
    """ckpt_hang_timeout=none: nothing is watched."""
    dog, _ = _dog(tmp_path, None)
    before = threading.active_count()
    dog.arm()
    assert threading.active_count() == before and not dog.on


def test_the_engine_s_measured_writes_count_as_saves(tmp_path):
    """An asynchronous write the engine measured (30 s) sets auto's save limit (5 x 30 s), though the training
    thread's save call itself was short."""
    dog = Watchdog("auto", saves=lambda: 30.0, exit=lambda code: None)
    dog.first_s, dog.longest = 2.0, {"step": 0.1, "save": 0.01}
    with dog.phase_of("save"):
        pass
    dog.phase = "save"
    assert dog.limit() == 150.0


class _Counted:
    """A group whose reads (``heard``) are counted."""

    def __init__(self, group) -> None:
        self.group, self.rank, self.size, self.reads = group, group.rank, group.size, 0

    def heard(self, name: str, timeout_s: float):
        self.reads += 1
        return self.group.heard(name, timeout_s)

    def notice(self, name: str, value: str) -> bool:
        return self.group.notice(name, value)


def _pair(tmp_path, limits: tuple[float, float], moving=(None, None), record=None):
    """Two processes' watchdogs over one ThreadGroup (limits: process 0's, process 1's; moving: each one's probe,
    as the restore's; record: both ones' ``record_failure``); their exits, each ``(rank, code, whether process 1
    had said that it leaves)``."""
    members = [_Counted(m) for m in ThreadGroup(2).members]
    exits: list[tuple[int, int, bool]] = []
    dogs = []
    for rank, limit in enumerate(limits):
        (tmp_path / f"p{rank}").mkdir()

        def leave(code: int, rank: int = rank) -> None:
            exits.append((rank, code, members[0].group.heard("hang-left/1", 0.001) == "1"))

        dog = Watchdog(limit, str(tmp_path / f"p{rank}" / "ckpt.log"), record, who=f"process {rank} of 2", exit=leave,
                       moving=moving[rank])  # fmt: skip
        dog.among(members[rank])
        dogs.append(dog)
    return dogs, members, exits


def test_a_hang_one_process_finds_ends_the_other_with_124_and_process_0_leaves_last(tmp_path):
    """Process 1's watchdog fires (0.5 s): process 0 (limit 6 s), without progress for a quarter of it, hears it
    and ends too, long before its own limit, naming process 1; process 0 exits only after process 1 said that it
    leaves (the JAX service's host last: the others are not aborted with 134)."""
    dogs, _, exits = _pair(tmp_path, (6.0, 0.5))
    began = time.monotonic()
    for dog in dogs:
        dog.arm()
    while len(exits) < 2 and time.monotonic() - began < 15.0:
        time.sleep(0.05)
    took = time.monotonic() - began
    assert sorted(exits) == [(0, HANG_EXIT, True), (1, HANG_EXIT, True)], exits
    assert took < 6.0, took
    log0 = (tmp_path / "p0" / "ckpt.log").read_text()
    assert "process 1 of 2 found the job hung first" in log0 and "exiting with status 124" in log0, log0
    assert "found the job hung first" not in (tmp_path / "p1" / "ckpt.log").read_text()


def test_a_process_stuck_in_a_read_whose_bytes_still_move_hears_the_hang(tmp_path):
    """Process 1 is in a restore whose probe moves a little at every wake-up (a JAX process's own service reads a
    few bytes now and then) but has made no progress of its own: it listens after a quarter of its limit all the
    same, hears the hang that process 0 found (0.5 s) and leaves with 124 before process 0's hand-off runs out,
    long before its own limit (20 s, which the moving bytes keep putting off)."""
    took = _process_1_in_a_restore_hears(tmp_path, 20.0, _moving())
    assert took < 0.25 * 20.0 + 2.0 + 5.0, took


def _moving():
    """A restore's probe that moves at every reading."""
    ticks = [0]

    def moving() -> int:
        ticks[0] += 1
        return ticks[0]

    return moving


def _process_1_in_a_restore_hears(tmp_path, limit: float, moving=None, record=None) -> float:
    """Process 1 in a restore (``limit``; ``moving``: its probe) and process 0 finding the hang at 0.5 s: both
    leave with 124, process 1 before process 0, naming process 0. Returns how long that took."""
    dogs, _, exits = _pair(tmp_path, (0.5, limit), moving=(None, moving), record=record)
    dogs[1].arm("restore")
    dogs[0].arm()
    began = time.monotonic()
    while len(exits) < 2 and time.monotonic() - began < 15.0:
        time.sleep(0.05)
    assert sorted(exits) == [(0, HANG_EXIT, True), (1, HANG_EXIT, True)], exits
    assert "process 0 of 2 found the job hung first" in (tmp_path / "p1" / "ckpt.log").read_text()
    return time.monotonic() - began


def test_a_process_with_a_long_limit_listens_after_a_quarter_of_the_meeting_bound(tmp_path, monkeypatch):
    """Process 1 is stuck in a restore under auto's limit there (600 s) and process 0 finds the hang at a
    meeting's bound (CANDLE_CKPT_GROUP_TIMEOUT_S=2; here its limit, 0.5 s): process 1 listens once it made no
    progress for a quarter of the bound, not of its own limit (150 s: process 0, gone after its 15-s hand-off,
    would have left it to be aborted by JAX), and both leave with 124 within a wake-up of process 1's (5 s)."""
    monkeypatch.setenv("CANDLE_CKPT_GROUP_TIMEOUT_S", "2")
    took = _process_1_in_a_restore_hears(tmp_path, 600.0)
    assert took < 0.5 + 5.0 + 3.0, took


def test_the_finder_tells_the_others_before_its_report_so_that_theirs_overlap_it(tmp_path, monkeypatch):
    """Every report takes its whole bound (a file system that stopped answering; here REPORT_S = 4 s), and
    process 0's wait after its own report (HANDOFF_S = 2 s) is shorter than a report: process 1, in a restore,
    hears of the hang that process 0 found at once, writes its report while process 0 writes its own, and leaves
    before process 0's wait runs out. Told after process 0's report, it was still writing its own when process 0
    exited (in a JAX job, JAX would then abort it: 134, not requeued)."""
    monkeypatch.setattr("candle_ckpt.engine.watchdog.REPORT_S", 4.0)
    monkeypatch.setattr("candle_ckpt.engine.hang_notice.HANDOFF_S", 2.0)
    stopped = threading.Event()  # each report's record waits on it, past the report's bound
    try:
        took = _process_1_in_a_restore_hears(tmp_path, 2.0, _moving(), record=lambda *_: stopped.wait(30.0))
    finally:
        stopped.set()
    assert took < 0.5 + 4.0 + 2.0, took


def test_process_0_waits_a_bounded_time_for_a_peer_that_cannot_answer(tmp_path, monkeypatch):
    """Process 0 finds the hang and process 1 never answers (stopped): process 0 exits after HANDOFF_S."""
    monkeypatch.setattr("candle_ckpt.engine.hang_notice.HANDOFF_S", 1.5)
    dogs, _, exits = _pair(tmp_path, (0.5, 600.0))
    dogs[0].arm()
    began = time.monotonic()
    _wait(exits, 15.0)
    took = time.monotonic() - began
    assert exits == [(0, HANG_EXIT, False)]
    assert 0.5 + 1.5 <= took < 0.5 + 1.5 + 5.0, took


def test_a_process_that_makes_progress_never_asks_the_others(tmp_path):
    """Steps ending more often than a quarter of the limit: not one read of the group (nothing per step), and no
    function of engine/hang_notice.py runs at the wake-ups (docs/architecture.rst counts the modules a SIGTERM's
    walk enters; a wake-up that called into it made that count depend on when the watchdog woke)."""
    dogs, members, exits = _pair(tmp_path, (2.0, 2.0))
    walk = Walk().install()  # the walks' own hook (module_walk.py), here on the watchdog's thread alone:
    sys.setprofile(None)  # this thread's beats are not its wake-ups
    try:
        walk.start()
        dogs[0].arm()
    finally:
        threading.setprofile(None)
    for _ in range(60):
        time.sleep(0.05)
        dogs[0].beat()
    dogs[0].disarm()
    entered = walk.stop()
    assert exits == [] and members[0].reads == 0
    assert "candle_ckpt.engine.watchdog" in entered, entered  # the hook saw the wake-ups
    assert "candle_ckpt.engine.hang_notice" not in entered, entered
