"""The one preemption controller (engine.preempt_control) and its agreements, without a framework.

The controller saves and tells the run (``on_saved``); the run's end of that save
(engine.preempt.finish_preempted: durable, recorded, then exit or return) is wired here as the run wires it.
"""

from __future__ import annotations

import signal

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.group import SOLO
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.notice import NoticeAgreement
from candle_ckpt.engine.preempt import exit_status, finish_preempted
from candle_ckpt.engine.preempt_control import PreemptionController
from candle_ckpt.engine.step_plan import StepPlan


class ScriptedAgreement:
    """An agreement of several workers where another worker asked: it answers True from the ``at``-th point on."""

    requested = None

    def __init__(self, at: int) -> None:
        self.at, self.points = at, 0

    def start(self) -> None:
        pass

    def request(self, reason: str) -> None:
        pass

    def close(self, meet: bool = True) -> None:
        pass

    def step_end(self, local) -> bool:
        self.points += 1
        return bool(local) or self.points >= self.at

    now = step_end

    def stats(self) -> dict:
        return {"points": self.points}


class Store:
    layout = Layout.at("/nowhere")


class Engine:
    """What the run's end of a preemption save uses of a CheckpointEngine: finish, records, store, scratch_dir,
    preempt, and the checkpoint resumed (none here)."""

    def __init__(self, scratch_dir: str | None = None) -> None:
        self.saved: list[tuple[int, int, dict, str]] = []
        self.finished = 0
        self.records: list[dict] = []
        self.store, self.scratch_dir, self.preempt = Store(), scratch_dir, None
        self.resumed = None

    def save(self, epoch: int, step: int | None, logs: dict | None = None):
        """The ``save(reason)`` a training loop hands to the controller for this step."""

        def save(reason: str, background: bool = False) -> None:
            self.saved.append((epoch, step, logs or {}, reason if not background else f"{reason} (background)"))

        return save

    def finish(self) -> None:
        self.finished += 1


def controller(engine: Engine, agreement=None, **params) -> PreemptionController:
    """A controller catching SIGUSR1 (never armed here: requests come through ``watcher.trigger``)."""
    cfg = CkptConfig.from_params({"ckpt_preempt_signals": "SIGUSR1", "ckpt_deadline": "none", **params})
    kwargs = {} if agreement is None else {"agreement": agreement}
    return PreemptionController(cfg, OpsLog(None), on_saved=ends(engine, cfg), **kwargs)


def ends(engine: Engine, cfg: CkptConfig):
    """The run's ``on_saved``: its end of the preemption save, on this engine."""
    return lambda saved: finish_preempted(saved, engine, cfg.preempt_exit_code, OpsLog(None))


def test_one_process_answers_with_its_own_flag_at_every_step_without_a_collective() -> None:
    """With one worker (MirroredStrategy, or none) the local flag is the answer at every step."""
    agreement = NoticeAgreement(SOLO)
    agreement.start()
    assert [agreement.step_end(flag) for flag in (False, True, False)] == [False, True, False]
    agreement.close()


def test_a_peers_request_saves_the_agreed_step_once_then_the_process_exits_143() -> None:
    """When the workers agree on another worker's request, this one saves that step once (reason 'peer'),
    joins the write, records it (engine.preempt), and exits with 143 (a peer's request counts as SIGTERM)."""
    engine = Engine(scratch_dir="/tmp/scratch")
    agreement = ScriptedAgreement(at=2)
    pre = controller(engine, agreement)
    assert pre.step_end(0, 1, engine.save(0, 1)) is False
    with pytest.raises(SystemExit) as exc:
        pre.step_end(0, 2, engine.save(0, 2, {"loss": 0.5}))
    assert exc.value.code == 143
    assert engine.saved == [(0, 2, {"loss": 0.5}, "peer")] and engine.finished == 1
    assert pre.saved_at == (0, 2) and pre.mid_epoch and agreement.stats()["points"] == 2
    assert engine.preempt["reason"] == "peer" and engine.preempt["step"] == 2 and engine.preempt["exit_code"] == 143
    assert pre.step_end(0, 3, engine.save(0, 3)) is True and engine.saved[1:] == []


def test_with_return_training_stops_and_fit_returns() -> None:
    """ckpt_preempt_exit_code=return: no exit; step_end answers True from the save on, without another save."""
    engine = Engine()
    pre = controller(engine, ckpt_preempt_exit_code="return")
    pre.watcher.trigger("SIGUSR1", signal.SIGUSR1)
    assert pre.step_end(3, 7, engine.save(3, 7)) is True
    assert pre.step_end(3, 8, engine.save(3, 8)) is True
    assert engine.saved == [(3, 7, {}, "SIGUSR1")] and engine.finished == 1
    assert engine.preempt["exit_code"] is None and engine.preempt["signal_to_commit_s"] >= 0


@pytest.mark.parametrize(
    ("setting", "reason", "signum", "code"),
    [
        ("signal", "SIGTERM", signal.SIGTERM, 143),
        ("signal", "SIGUSR1", signal.SIGUSR1, 128 + signal.SIGUSR1),
        ("signal", "deadline", None, 143),
        (42, "SIGTERM", signal.SIGTERM, 42),
        (0, "SIGTERM", signal.SIGTERM, 0),
    ],
)
def test_the_exit_status_is_128_plus_the_signal_unless_one_is_given(setting, reason, signum, code) -> None:
    """By default the process ends as the signal's default action would end it; ckpt_preempt_exit_code=N wins."""
    engine = Engine()
    pre = controller(engine, ckpt_preempt_exit_code=setting)
    pre.watcher.trigger(reason, signum)
    with pytest.raises(SystemExit) as exc:
        pre.step_end(0, 1, engine.save(0, 1))
    assert exc.value.code == code == engine.preempt["exit_code"]
    assert exit_status("return", pre.watcher.pending) is None


def test_an_epoch_end_request_saves_that_epoch_with_the_given_save() -> None:
    """epoch_end: an epoch end is a point of the agreement like a step; there the epoch's save runs."""
    engine, reasons = Engine(), []
    agreement = ScriptedAgreement(at=2)
    pre = controller(engine, agreement, ckpt_preempt_exit_code="return")
    assert pre.epoch_end(1, False, reasons.append) is False
    assert pre.epoch_end(2, False, reasons.append) is True
    assert reasons == ["preempt:peer"] and pre.saved_at == (2, 0) and not pre.mid_epoch and engine.saved == []


def test_an_epoch_the_policy_saved_is_not_saved_twice_and_the_last_epoch_only_logs() -> None:
    """A saved epoch is not forced again; at the last epoch a request is logged, nothing is saved, nothing exits."""
    engine, reasons = Engine(), []
    pre = controller(engine, ckpt_preempt_exit_code="return")
    pre.watcher.trigger("SIGUSR1", signal.SIGUSR1)
    assert pre.epoch_end(5, True, reasons.append, last_epoch=True) is False
    assert pre.epoch_end(4, True, reasons.append) is True and reasons == []


def test_tensor_like_logs_become_numbers_only_for_the_save() -> None:
    """plain_logs: values converted with float(); values that are no number are dropped."""
    from candle_ckpt.engine.preempt_control import plain_logs

    class Scalar:
        def __float__(self) -> float:
            return 2.5

    assert plain_logs({"loss": Scalar(), "name": "x"}) == {"loss": 2.5}


def test_nothing_watched_means_no_agreement_at_all() -> None:
    """ckpt_preempt_signals=none and no deadline (the same on every worker): no collective ever runs."""
    agreement = ScriptedAgreement(at=1)
    engine = Engine()
    pre = controller(engine, agreement, ckpt_preempt_signals="none")
    assert not any(pre.step_end(0, s, engine.save(0, s)) for s in range(1, 5)) and agreement.points == 0
    assert pre.epoch_end(1, False, engine.save(1, None)) is False and agreement.points == 0


def test_step_saves_are_taken_only_where_the_loop_asks_for_them() -> None:
    """ckpt_save_steps=2: the fit callback's controller (step_saves) saves steps 2 and 4, not the last one, each
    asked to be written as an epoch's is (in the background where writes are asynchronous)."""
    engine = Engine()
    cfg = CkptConfig.from_params({"ckpt_save_steps": 2, "ckpt_preempt_signals": "none", "ckpt_deadline": "none"})
    pre = PreemptionController(cfg, OpsLog(None), steps=StepPlan(cfg, engine, True))
    for step in range(1, 7):
        pre.step_end(0, step, engine.save(0, step), last=step == 6)
    assert [(s, r) for _, s, _, r in engine.saved] == [(2, "steps (background)"), (4, "steps (background)")]
    assert not PreemptionController(cfg, OpsLog(None)).enabled


def test_a_caught_signal_is_handed_to_the_agreement_at_once() -> None:
    """arm() wires the watcher to the agreement's request(), and the signal owner's handler to the watcher: the
    other processes hear of a signal when it comes, not at this process's next step end."""
    import os

    from candle_ckpt.engine.signals import SignalOwner

    class Asking(ScriptedAgreement):
        asked: list[str] = []

        def request(self, reason: str) -> None:
            self.asked.append(reason)

    agreement = Asking(at=100)
    pre = controller(Engine(), agreement)
    owner = SignalOwner()
    pre.arm()
    lease = owner.watch(pre.watcher.signals, pre.watcher.notice)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert agreement.asked == ["SIGUSR1"] and pre.watcher.pending.reason == "SIGUSR1"
    finally:
        owner.end(lease)
        pre.close(ended=False)
