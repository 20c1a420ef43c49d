"""The per-step preemption decision (distributed.agreement, distributed.preempt_sync) without a framework."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.layout import Layout
from candle_ckpt.core.log import OpsLog
from candle_ckpt.distributed.agreement import SaveAgreement
from candle_ckpt.distributed.preempt_sync import PreemptSync, make_sync
from candle_ckpt.distributed.worker_state import WorkerInfo
from candle_ckpt.engine.preempt import PreemptionWatcher


class CountingAgreement(SaveAgreement):
    """A multi-worker agreement whose collective is a list: the other workers' flags, one per check."""

    def __init__(self, every: int, others: list[bool]) -> None:
        super().__init__(None, 2, every=every)
        self.others = others
        self.sent: list[float] = []

    def _sum(self, value: float) -> float:
        self.sent.append(value)
        return value + (1.0 if self.others.pop(0) else 0.0)


class Store:
    layout = Layout.at("/nowhere")


class Engine:
    """What PreemptSync uses of a CheckpointEngine: save_step, finish, records, store, scratch_dir, preempt."""

    def __init__(self, scratch_dir: str | None = None) -> None:
        self.saved: list[tuple[int, int, dict, str]] = []
        self.finished = 0
        self.records: list[dict] = []
        self.store, self.scratch_dir, self.preempt = Store(), scratch_dir, None

    def save_step(self, epoch, step, logs, capture, reason):
        capture()
        self.saved.append((epoch, step, logs, reason))
        return None

    def finish(self) -> None:
        self.finished += 1


def watcher() -> PreemptionWatcher:
    return PreemptionWatcher([signal.SIGUSR1])  # never armed here: requests come through trigger()


def test_one_process_answers_with_its_own_flag_at_every_step_without_a_collective() -> None:
    """With one worker (MirroredStrategy, or none) the local flag is the answer at every step, every=1 or not."""
    agreement = SaveAgreement(None, 1, every=5)
    assert [agreement.step_end(flag) for flag in (False, True, False)] == [False, True, False]
    assert agreement.stats()["checks"] == 0


def test_workers_check_every_k_steps_and_a_flag_waits_for_the_next_check() -> None:
    """Only every k-th step runs the collective; another worker's flag counts as ours."""
    agreement = CountingAgreement(every=3, others=[False, True])
    answers = [agreement.step_end(step == 4) for step in range(1, 7)]
    assert answers == [False, False, False, False, False, True]  # checks at steps 3 and 6 only
    assert agreement.sent == [0.0, 0.0]
    assert agreement.stats()["checks"] == 2


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_check_interval_must_be_a_positive_int(bad) -> None:
    """ckpt_preempt_check is named when it is not an int > 0."""
    with pytest.raises(ValueError, match="ckpt_preempt_check"):
        SaveAgreement(None, 2, every=bad)


def test_a_peers_request_saves_the_agreed_step_once_then_training_stops() -> None:
    """When the workers agree on another worker's request, this one saves that step once (reason 'peer'),
    joins the write, records it in engine.preempt, and answers True from then on without a collective."""
    engine, captured = Engine(scratch_dir="/tmp/scratch"), []
    agreement = CountingAgreement(1, [False, True])
    sync = PreemptSync(engine, lambda: captured.append(1), agreement, watcher(), OpsLog(None))
    assert sync.step_end(0, 1, {"loss": 1.0}) is False
    assert sync.step_end(0, 2, {"loss": 0.5}) is True
    assert sync.step_end(0, 3) is True
    assert engine.saved == [(0, 2, {"loss": 0.5}, "peer")] and captured == [1] and engine.finished == 1
    assert sync.saved_at == (0, 2) and agreement.stats()["checks"] == 2
    assert engine.preempt["reason"] == "peer" and engine.preempt["step"] == 2


def test_with_an_exit_code_the_process_exits_after_the_save() -> None:
    """ckpt_preempt_exit_code: SystemExit with that code, raised only once the step is saved and joined."""
    engine, w = Engine(), watcher()
    w.trigger("SIGTERM", signal.SIGTERM)
    sync = PreemptSync(engine, lambda: None, SaveAgreement(None, 1), w, OpsLog(None), exit_code=42)
    with pytest.raises(SystemExit) as exc:
        sync.step_end(3, 7)
    assert exc.value.code == 42
    assert engine.saved == [(3, 7, {}, "SIGTERM")] and engine.finished == 1
    assert engine.preempt["signal_to_commit_s"] >= 0 and engine.preempt["exit_code"] == 42


def test_an_epoch_end_request_saves_that_epoch_with_the_given_save() -> None:
    """epoch_end: the workers agree at once (whatever ckpt_preempt_check says) and the epoch's save runs."""
    engine, w, reasons = Engine(), watcher(), []
    agreement = CountingAgreement(every=100, others=[False, True])
    sync = PreemptSync(engine, lambda: None, agreement, w, OpsLog(None))
    assert sync.epoch_end(1, reasons.append) is False
    assert sync.epoch_end(2, reasons.append) is True
    assert reasons == ["preempt:peer"] and sync.saved_at == (2, 0) and engine.saved == []


def test_tensor_like_logs_become_numbers_only_for_the_save() -> None:
    """Batch logs are converted with float() when a save needs them; values that are no number are dropped."""

    class Scalar:
        def __float__(self) -> float:
            return 2.5

    engine, w = Engine(), watcher()
    w.trigger("SIGTERM")
    sync = PreemptSync(engine, lambda: None, SaveAgreement(None, 1), w, OpsLog(None))
    sync.step_end(0, 1, {"loss": Scalar(), "name": "x"})
    assert engine.saved[0][2] == {"loss": 2.5}


def test_nothing_watched_means_no_agreement_at_all() -> None:
    """ckpt_preempt_signals=none and no deadline (the same on every worker): no collective ever runs."""
    agreement = CountingAgreement(every=1, others=[])
    sync = PreemptSync(Engine(), lambda: None, agreement, PreemptionWatcher(), OpsLog(None))
    assert not any(sync.step_end(0, s) for s in range(1, 5)) and agreement.sent == []


def test_make_sync_reads_the_parameters_and_the_role(tmp_path: Path) -> None:
    """make_sync: ckpt_preempt_check, the signals, the deadline and the exit code; checkpointing off catches nothing."""
    params = {
        "ckpt_preempt_check": 4,
        "ckpt_preempt_exit_code": 3,
        "ckpt_preempt_signals": "SIGUSR1,SIGTERM",
        "ckpt_deadline": "+3600",
    }
    info = WorkerInfo("worker", 1, 2, False)
    sync = make_sync(CkptConfig.from_params(params), Engine(), lambda: None, None, info, OpsLog(None))
    assert sync.agreement.every == 4 and sync.agreement.multi
    assert sync.exit_code == 3 and sync.who == "worker worker:1 "
    assert sorted(sync.watcher.signals) == sorted([signal.SIGUSR1, signal.SIGTERM])
    assert 3500 < sync.watcher.time_left() <= 3600
    off = make_sync(CkptConfig.from_params({**params, "ckpt_save_interval": 0}), Engine(), lambda: None, None, info,
                    OpsLog(None))  # fmt: skip
    assert not off.enabled
