"""ckpt_save_steps=auto's rule (engine.interval) and its wiring to a run (engine.step_plan), without a framework."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.history import append_local, new_record
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine import step_plan
from candle_ckpt.engine.decision import saves_epoch
from candle_ckpt.engine.interval import OVERHEAD, PRIOR_MTBF_S, StepInterval, choose, mtbf, spread
from candle_ckpt.engine.step_plan import StepPlan

times = st.floats(min_value=1e-4, max_value=1e3, allow_nan=False, allow_infinity=False)
costs = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
mtbfs = st.floats(min_value=1.0, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(times, costs, mtbfs)
def test_the_interval_never_costs_more_than_the_overhead_bound(step_s, save_s, mtbf_s) -> None:
    """One save per interval costs at most 2% of the training time between two saves."""
    chosen = choose(step_s, save_s, mtbf_s)
    assert chosen.steps >= 1
    assert save_s <= OVERHEAD * chosen.steps * step_s * (1 + 1e-9)


@given(times, costs, mtbfs)
def test_the_interval_is_never_shorter_than_young_daly(step_s, save_s, mtbf_s) -> None:
    """Saves come no more often than sqrt(2 x save cost x MTBF) needs; the reason names the bound that won."""
    chosen = choose(step_s, save_s, mtbf_s)
    daly = math.sqrt(2 * save_s * mtbf_s)
    assert chosen.steps * step_s >= daly * (1 - 1e-9)
    assert chosen.reason == ("overhead" if save_s / OVERHEAD >= daly else "young-daly")


@given(times, costs, costs, mtbfs)
def test_the_interval_grows_with_the_save_cost(step_s, save_a, save_b, mtbf_s) -> None:
    """A dearer save never gives a shorter interval."""
    low, high = sorted((save_a, save_b))
    assert choose(step_s, low, mtbf_s).steps <= choose(step_s, high, mtbf_s).steps


def test_young_daly_with_a_given_mtbf() -> None:
    """With 0.5 s saves, 1 h between failures and 0.1 s steps: sqrt(2 x 0.5 x 3600) = 60 s = 600 steps."""
    chosen = choose(0.1, 0.5, 3600.0)
    assert (chosen.steps, chosen.reason, chosen.seconds) == (600, "young-daly", pytest.approx(60.0))
    policy = StepInterval("auto", 3600.0)
    policy.observe_step(0.1)
    policy.observe_save(0.5)
    assert policy.current() == chosen


def test_the_overhead_bound_wins_when_failures_are_frequent() -> None:
    """Failures every 10 s and 0.5 s saves: Young/Daly says 3.2 s, but 2% overhead needs 25 s (250 steps)."""
    chosen = choose(0.1, 0.5, 10.0)
    assert (chosen.steps, chosen.reason) == (250, "overhead")


@given(st.integers(min_value=1, max_value=10**6), times, costs)
def test_a_number_passes_through_unchanged(every, step_s, save_s) -> None:
    """ckpt_save_steps=N means every N steps, whatever is measured."""
    policy = StepInterval(every)
    policy.observe_step(step_s)
    policy.observe_save(save_s)
    assert (policy.current().steps, policy.current().reason) == (every, "fixed")


def test_zero_is_off_and_auto_waits_for_a_measured_save() -> None:
    """0 is off; auto takes no step checkpoint before a save and a step time have been measured."""
    assert (StepInterval(0).current().steps, StepInterval(0).current().reason) == (0, "off")
    policy = StepInterval("auto")
    assert (policy.current().steps, policy.current().reason) == (0, "unmeasured")
    policy.observe_step(0.01)
    assert policy.current().steps == 0
    policy.observe_save(0.2)
    assert policy.current().steps > 0


def test_the_mtbf_is_learned_from_failures_with_a_prior_before_the_first() -> None:
    """Before a failure: the prior (or the time gone without one, if longer); after: seconds per failure."""
    assert mtbf(0, 60.0) == PRIOR_MTBF_S
    assert mtbf(0, 2 * PRIOR_MTBF_S) == 2 * PRIOR_MTBF_S
    assert mtbf(3, 300.0) == 100.0
    policy = StepInterval("auto")
    policy.failures(2, 120.0)
    assert policy.mtbf_s() == 60.0
    assert StepInterval("auto", 50.0).mtbf_s() == 50.0


def test_step_time_is_a_moving_average() -> None:
    """A single slow step moves the step time by a fifth of the difference, not to itself."""
    policy = StepInterval("auto")
    policy.observe_step(0.1)
    policy.observe_step(1.1)
    assert policy.step_s == pytest.approx(0.3)


@pytest.fixture(autouse=True)
def no_start_of_this_process(monkeypatch) -> None:
    """No restart() of this test process counts as the run's (another test may have made one in-process: the
    plan adds this process's start to the history, engine/restart_history.with_this_start)."""
    from candle_ckpt.engine import restart_history

    monkeypatch.setattr(restart_history, "_START", [])


class Engine:
    """What a StepPlan reads and writes of a CheckpointEngine."""

    def __init__(self, root: str, size: int = 1) -> None:
        self.root, self.records, self.log = root, [], OpsLog(None)
        self.store = type("Store", (), {"layout": Layout.at(root)})()
        self.group = type("Group", (), {"size": size})()
        self.agreed, self.note_out, self.step_interval = "", None, None
        self.resumed = None


def into(saved: list) -> Callable[..., None]:
    """A save that notes its reason (a periodic one is asked with ``background=True``)."""
    return lambda reason, background=False: saved.append(reason)


def no_save(reason: str, background: bool = False) -> None:
    """A save that does nothing: for steps whose saves the test does not look at."""


def plan(engine: Engine, **params) -> StepPlan:
    return StepPlan(CkptConfig.from_params({"ckpt_directory": engine.root, **params}), engine, True)


def test_the_plan_saves_after_a_measured_save_and_reports_why(tmp_path) -> None:
    """No step checkpoint before a save is measured; then one every N steps; stats()["steps"] says N and why."""
    engine, saved = Engine(str(tmp_path)), []
    steps = plan(engine, ckpt_mtbf=100.0)
    steps.arm(0.0)
    for step in range(1, 6):
        steps.step_end(step, 0.01, into(saved))
    assert saved == [] and engine.step_interval["reason"] == "unmeasured"
    engine.records.append({"epoch": 1, "snapshot_s": 0.01, "save_s": 0.09})  # an epoch checkpoint: 0.1 s
    for step in range(1, 500):
        steps.step_end(step, 0.01, into(saved))
    # max(0.1 / 0.02, sqrt(2 x 0.1 x 100)) = max(5, 4.47) s = 500 steps of 0.01 s
    assert engine.step_interval["interval"] == 500 and engine.step_interval["reason"] == "overhead"
    assert saved == []
    steps.step_end(500, 0.01, into(saved))
    assert saved == ["steps"]
    # The step checkpoint's own blocked time (here a list append) now counts beside the probe's 0.1 s.
    assert engine.step_interval["save_s"] < 0.1 and engine.step_interval["interval"] < 500


def test_the_plan_learns_the_mtbf_from_the_restart_history(tmp_path) -> None:
    """Three restarts 100 s apart are two failures in 200 s: an MTBF of 100 s."""
    engine = Engine(str(tmp_path))
    history = Layout.at(str(tmp_path)).history
    for at in (1000.0, 1100.0, 1200.0):
        record = new_record("restart", resumed=None)
        record["time"] = at
        append_local(history, record)
    steps = plan(engine)
    steps.arm(1200.0)
    engine.records.append({"epoch": 1, "snapshot_s": 0.0, "save_s": 0.5})
    for step in (1, 2):  # the first step of a fit compiles: its time is left out
        steps.step_end(step, 0.1, no_save)
    assert engine.step_interval["mtbf_s"] == 100.0
    assert engine.step_interval["reason"] == "overhead"  # sqrt(2 x 0.5 x 100) = 10 s < 25 s


def test_several_processes_use_the_agreed_word_not_their_own_times(tmp_path) -> None:
    """In a job of several processes the interval is the primary's word once adopted, whatever this one measured."""
    engine, saved = Engine(str(tmp_path), size=2), []
    steps = plan(engine)
    assert engine.note_out is not None
    engine.records.append({"epoch": 1, "snapshot_s": 0.0, "save_s": 0.1})
    for step in range(1, 10):
        steps.step_end(step, 0.01, into(saved))
    assert saved == [] and engine.step_interval["reason"] == "unmeasured"
    word = json.loads(engine.note_out(0.1))  # a commit that cost 0.1 s so far
    assert word["interval"] > 9
    engine.agreed = json.dumps({"interval": 3, "reason": "young-daly"})
    for step in range(1, 10):
        steps.step_end(step, 0.01, into(saved))
    assert len(saved) == 3 and engine.step_interval["interval"] == 3


def test_the_plan_reads_the_failures_of_the_persistent_tier_too(tmp_path) -> None:
    """A run moved to an empty node learns its MTBF from the persistent tier's copy of the history."""
    engine = Engine(str(tmp_path / "fast"))
    shared = tmp_path / "shared"
    for at in (1000.0, 1100.0, 1200.0):
        record = new_record("restart", resumed=None)
        record["time"] = at
        append_local(str(shared / "restarts.jsonl"), record)
    steps = plan(engine, ckpt_persistent_url=str(shared))
    steps.arm(1200.0)
    engine.records.append({"epoch": 1, "snapshot_s": 0.0, "save_s": 0.5})
    for step in (1, 2):
        steps.step_end(step, 0.1, no_save)
    assert engine.step_interval["mtbf_s"] == 100.0


def test_the_first_relaunch_counts_its_own_restart_before_its_record_is_written(tmp_path, monkeypatch) -> None:
    """A fresh start leaves no record, and a resume's record waits for its first step: the first relaunch's fit
    begins with no history on disk, and still counts the failure before it (one in 50 s: an MTBF of 50 s)."""
    from candle_ckpt.engine import restart_history

    record = new_record("restart", resumed="epochs/001")
    record["time"] = 1000.0
    engine = Engine(str(tmp_path))
    steps = plan(engine)
    own = restart_history.History(steps.cfg, engine.log, writes=False)
    other = restart_history.History(plan(Engine(str(tmp_path / "other"))).cfg, engine.log, writes=False)
    monkeypatch.setattr(restart_history, "_START", [restart_history.Start({}, other, record, False)])
    steps.arm(1050.0)  # a start of another run's directory (one process training several): not this run's
    steps.step_end(1, 0.1, no_save)
    assert engine.step_interval["mtbf_s"] == PRIOR_MTBF_S
    monkeypatch.setattr(restart_history, "_START", [restart_history.Start({}, own, record, False)])
    steps.arm(1050.0)
    engine.records.append({"epoch": 1, "snapshot_s": 0.0, "save_s": 0.5})
    for step in (1, 2):
        steps.step_end(step, 0.1, no_save)
    assert not os.path.exists(Layout.at(str(tmp_path)).history)
    assert engine.step_interval["mtbf_s"] == 50.0
    monkeypatch.setattr(restart_history, "_START", [])  # no start of this process known: the prior stands
    steps.arm(1050.0)
    steps.step_end(3, 0.1, no_save)
    assert engine.step_interval["mtbf_s"] == PRIOR_MTBF_S


@given(st.integers(min_value=1, max_value=100_000), st.integers(min_value=1, max_value=100_000))
def test_spread_never_takes_more_saves_than_the_interval_and_keeps_gaps_under_one_and_a_half(every, steps) -> None:
    """Within an epoch whose end saves anyway: equal parts, no more saves than every `every` steps would take (the
    epoch end included), and no gap over 1.5 intervals unless the epoch itself is the one gap."""
    gap = spread(every, steps)
    parts = math.ceil(steps / gap)
    assert parts <= math.ceil(steps / every)
    assert gap <= max(1.5 * every + 1, steps) and (parts == 1 or gap <= 1.5 * every + 1)
    if steps >= 1.5 * every:  # then at least two parts, evenly: the last one is not a sliver
        assert parts >= 2 and steps - (parts - 1) * gap >= gap - parts


def test_spread_examples() -> None:
    assert spread(414, 416) == 416  # one part: the epoch's own checkpoint, no step checkpoint two steps before it
    assert spread(300, 416) == 416  # 416 / 300 = 1.4: still one part
    assert spread(200, 416) == 208  # two parts: 208 and the epoch end (not 200, 400 and 416)
    assert spread(400, 4115) == 412  # ten parts
    assert spread(1, 7) == 1


def test_an_epoch_is_saved_whatever_the_metrics_per_interval_skip_and_last_epoch(tmp_path) -> None:
    cfg = lambda **p: CkptConfig.from_params({"ckpt_directory": str(tmp_path), "epochs": 10, **p})  # noqa: E731
    assert all(saves_epoch(cfg(), done) for done in range(1, 11))
    assert [d for d in range(1, 11) if saves_epoch(cfg(ckpt_save_interval=3), d)] == [3, 6, 9, 10]
    assert [d for d in range(1, 11) if saves_epoch(cfg(ckpt_skip_epochs=8), d)] == [8, 9, 10]
    assert not any(saves_epoch(cfg(ckpt_save_interval=0), d) for d in range(1, 11))


class Saves:
    """A step checkpoint that blocks 0.08 s of the plan's clock (its own time is what the plan learns), and the
    steps it was taken at."""

    def __init__(self, monkeypatch) -> None:
        import candle_ckpt.engine.step_plan as step_plan

        self.at: list[int] = []
        self.now, self.step = 0.0, 0
        monkeypatch.setattr(step_plan, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: self.now)}))

    def save(self, reason: str, background: bool = False) -> None:
        assert background, "a periodic step checkpoint is asked to be written as an epoch's (in the background)"
        self.now += 0.08
        self.at.append(self.step)

    def run(self, steps: StepPlan, first: int, last: int, **where) -> list[int]:
        self.at = []
        for self.step in range(first, last + 1):
            if self.step != where.get("of"):  # an epoch's last step: the controller leaves it to the epoch's save
                steps.step_end(self.step, 0.01, self.save, **where)
        return self.at


def measured(engine: Engine, **params) -> StepPlan:
    """A plan whose interval is 400 steps of 0.01 s (a 0.08-s save: the 2% bound, 4 s) from its first steps."""
    steps = plan(engine, ckpt_mtbf=50.0, **params)
    steps.arm(0.0)
    engine.records.append({"epoch": 1, "snapshot_s": 0.0, "save_s": 0.08})
    return steps


def test_auto_spreads_step_checkpoints_over_an_epoch_whose_end_saves_anyway(tmp_path, monkeypatch) -> None:
    """An interval of 400 steps in epochs of 416: no step checkpoint two steps short of the epoch's own; in
    epochs of 1000: two step checkpoints at 334 and 668 (three even parts), not at 400 and 800."""
    engine, saves = Engine(str(tmp_path)), Saves(monkeypatch)
    steps = measured(engine, epochs=10)
    assert saves.run(steps, 1, 416, epoch=1, of=416) == []
    assert engine.step_interval["interval"] == 400 and engine.step_interval["every"] == 416
    assert saves.run(steps, 1, 1000, epoch=2, of=1000) == [334, 668]
    assert engine.step_interval["every"] == 334
    # Without the epoch's length (an input of unknown length): every 400 steps, as before.
    assert saves.run(steps, 1, 1000, epoch=3) == [400, 800]


def test_an_epoch_whose_end_does_not_save_keeps_the_interval_and_a_number_is_never_spread(tmp_path, monkeypatch):
    saves = Saves(monkeypatch)
    steps = measured(Engine(str(tmp_path)), epochs=10, ckpt_save_interval=2)
    assert saves.run(steps, 1, 416, epoch=0, of=416) == [400]  # epoch index 0: its end (1 epoch done) is not saved
    steps = plan(Engine(str(tmp_path / "fixed")), epochs=10, ckpt_save_steps=400)
    steps.arm(0.0)
    assert saves.run(steps, 1, 416, epoch=1, of=416) == [400]


def test_a_relaunch_takes_its_probe_and_its_first_step_from_the_checkpoint_it_resumed(tmp_path, monkeypatch) -> None:
    """A fit resumed from a step checkpoint (step 832 of 4115, written in 0.08 s) has saved nothing itself: it takes
    step checkpoints from its first steps on, spaced from step 832, not from its first epoch end."""
    engine, saves = Engine(str(tmp_path)), Saves(monkeypatch)
    steps = plan(engine, epochs=10, ckpt_mtbf=50.0)
    steps.arm(0.0)
    engine.resumed = type("Side", (), {"step": 832, "save_duration_s": 0.08})()
    at = saves.run(steps, 833, 4115, epoch=7, of=4115)
    assert engine.step_interval["interval"] == 400 and engine.step_interval["every"] == spread(400, 4115) == 412
    assert at == list(range(832 + 412, 4115, 412))
    # Without the resumed checkpoint's time: nothing until this process's first save is measured (as before).
    engine = Engine(str(tmp_path / "unmeasured"))
    steps = plan(engine, epochs=10, ckpt_mtbf=50.0)
    steps.arm(0.0)
    assert saves.run(steps, 833, 4115, epoch=7, of=4115) == [] and engine.step_interval["reason"] == "unmeasured"
    # Several processes wait for the primary's word: the resumed checkpoint's time is not taken as the probe.
    engine = Engine(str(tmp_path / "mp"), size=2)
    steps = plan(engine, epochs=10, ckpt_mtbf=50.0)
    steps.arm(0.0)
    engine.resumed = type("Side", (), {"step": 832, "save_duration_s": 0.08})()
    assert saves.run(steps, 833, 1500, epoch=7, of=4115) == [] and engine.step_interval["reason"] == "unmeasured"


class Clock:
    """``time.perf_counter`` for step_plan: a save advances it by what it blocks."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def saving_plan(tmp_path, monkeypatch, blocked: float) -> tuple[StepPlan, list, Callable[..., None]]:
    """A plan every 50 steps whose saves block ``blocked`` seconds, after 49 steps of 10 ms (the moving step time)."""
    clock = Clock()
    monkeypatch.setattr(step_plan, "time", clock)
    saved: list = []

    def save(reason: str, background: bool = False) -> None:
        saved.append(reason)
        clock.now += blocked

    steps = plan(Engine(str(tmp_path)), ckpt_save_steps=50)
    steps.arm(0.0)
    for step in range(1, 50):
        steps.step_end(step, 0.010, save)
    return steps, saved, save


def test_a_save_costs_its_blocked_time_and_the_slowdown_of_the_steps_after_it(tmp_path, monkeypatch) -> None:
    """A save that blocks 40 ms and slows the next 10 steps by 2 ms each costs 60 ms once 32 steps have passed."""
    steps, saved, save = saving_plan(tmp_path, monkeypatch, 0.040)
    steps.step_end(50, 0.010, save)
    assert saved == ["steps"] and steps.policy.saves[-1] == pytest.approx(0.040)
    steps.step_end(51, 0.040 + 0.012, save)  # the step after the save: its time includes the save's
    for step in range(52, 61):
        steps.step_end(step, 0.012, save)
    assert steps.policy.saves[-1] == pytest.approx(0.040)  # 10 of 32 steps counted: not yet revised
    for step in range(61, 83):
        steps.step_end(step, 0.010, save)
    assert steps.policy.saves[-1] == pytest.approx(0.060)


def test_an_epoch_end_inside_the_window_is_not_charged_to_the_save(tmp_path, monkeypatch) -> None:
    """Five slowed steps after a save, then a new epoch whose first step carries validation and the epoch's
    checkpoint (0.5 s): the save costs its blocked time and the five steps' slowdown, not the epoch end."""
    steps, saved, save = saving_plan(tmp_path, monkeypatch, 0.040)
    steps.step_end(50, 0.010, save)
    steps.step_end(51, 0.040 + 0.013, save)
    for step in range(52, 56):
        steps.step_end(step, 0.013, save)
    steps.step_end(1, 0.5, save)
    assert saved == ["steps"]
    assert steps.policy.saves[-1] == pytest.approx(0.055)


def test_a_save_never_counts_less_than_it_blocked(tmp_path, monkeypatch) -> None:
    """Steps after a save that happen to run faster than before do not make the save cheaper than its blocked time."""
    steps, saved, save = saving_plan(tmp_path, monkeypatch, 0.040)
    steps.step_end(50, 0.010, save)
    for step in range(51, 83):
        steps.step_end(step, 0.005, save)
    assert saved == ["steps"]
    assert steps.policy.saves[-1] == pytest.approx(0.040)
