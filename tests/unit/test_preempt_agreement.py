"""The per-step preemption decision (distributed.agreement, distributed.preempt_sync) without a framework."""

from __future__ import annotations

import os
import signal

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.log import OpsLog
from candle_ckpt.distributed import preempt_sync
from candle_ckpt.distributed.agreement import SaveAgreement
from candle_ckpt.distributed.preempt_sync import LocalSignals, PreemptSync, make_sync
from candle_ckpt.distributed.worker_state import WorkerInfo


class CountingAgreement(SaveAgreement):
    """A multi-worker agreement whose collective is a list: the other workers' flags, one per check."""

    def __init__(self, every: int, others: list[bool]) -> None:
        super().__init__(None, 2, every=every)
        self.others = others
        self.sent: list[float] = []

    def _sum(self, value: float) -> float:
        self.sent.append(value)
        return value + (1.0 if self.others.pop(0) else 0.0)


class Flag:
    def __init__(self) -> None:
        self.set, self.signalled_at, self.armed = False, None, False

    def requested(self) -> bool:
        return self.set

    def arm(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False


class Engine:
    def __init__(self) -> None:
        self.saved: list[tuple[int, int, dict]] = []
        self.finished = 0

    def finish(self) -> None:
        self.finished += 1


@pytest.fixture
def engine(monkeypatch) -> Engine:
    eng = Engine()

    def save(engine, epoch, step, logs, capture):
        capture()
        engine.saved.append((epoch, step, logs))
        return True

    monkeypatch.setattr(preempt_sync, "commit_step", save)
    return eng


def test_one_process_answers_with_its_own_flag_at_every_step_without_a_collective() -> None:
    """With one worker (MirroredStrategy, or none) the local flag is the answer at every step, every=1 or not."""
    agreement = SaveAgreement(None, 1, every=5)
    assert [agreement.step_end(flag) for flag in (False, True, False)] == [False, True, False]
    assert agreement.stats()["checks"] == 0


def test_workers_check_every_k_steps_and_a_flag_waits_for_the_next_check() -> None:
    """A flag set between checks is carried to the next check; another worker's flag counts as ours."""
    agreement = CountingAgreement(every=3, others=[False, True])
    answers = [agreement.step_end(step == 4) for step in range(1, 7)]
    assert answers == [False, False, False, False, False, True]  # checks at steps 3 and 6 only
    assert agreement.sent == [0.0, 0.0]  # our flag (set at step 4 only) had gone by step 6: the other's decided
    assert agreement.stats()["checks"] == 2


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_check_interval_must_be_a_positive_int(bad) -> None:
    """ckpt_preempt_check is named when it is not an int > 0."""
    with pytest.raises(ValueError, match="ckpt_preempt_check"):
        SaveAgreement(None, 2, every=bad)


def test_the_agreed_step_is_saved_once_then_training_stops(engine: Engine) -> None:
    """When the workers agree, this worker saves that (epoch, step) once, joins the write, and stops from then on."""
    flag, captured = Flag(), []
    sync = PreemptSync(engine, lambda: captured.append(1), CountingAgreement(1, [False, True]), flag, OpsLog(None))
    assert sync.step_end(0, 1, {"loss": 1.0}) is False
    assert sync.step_end(0, 2, {"loss": 0.5}) is True  # another worker was signalled
    assert sync.step_end(0, 3) is True  # no second save, no further collective
    assert engine.saved == [(0, 2, {"loss": 0.5})] and captured == [1] and engine.finished == 1
    assert sync.saved_at == (0, 2) and sync.record["signal_here"] is False


def test_with_an_exit_code_the_process_exits_after_the_save(engine: Engine) -> None:
    """ckpt_preempt_exit_code: SystemExit with that code, raised only once the step is saved and joined."""
    flag = Flag()
    flag.set, flag.signalled_at = True, 0.0
    sync = PreemptSync(engine, lambda: None, SaveAgreement(None, 1), flag, OpsLog(None), exit_code=42)
    with pytest.raises(SystemExit) as exc:
        sync.step_end(3, 7)
    assert exc.value.code == 42
    assert engine.saved == [(3, 7, {})] and engine.finished == 1
    assert sync.record["signal_here"] is True and sync.record["signal_to_commit_s"] >= 0


def test_tensor_like_logs_become_numbers_only_for_the_save(engine: Engine) -> None:
    """Batch logs are converted with float() when a save needs them; values that are no number are dropped."""

    class Scalar:
        def __float__(self) -> float:
            return 2.5

    flag = Flag()
    flag.set = True
    sync = PreemptSync(engine, lambda: None, SaveAgreement(None, 1), flag, OpsLog(None))
    sync.step_end(0, 1, {"loss": Scalar(), "name": "x"})
    assert engine.saved == [(0, 1, {"loss": 2.5})]


def test_a_signal_only_sets_the_flag_and_disarm_restores_the_default() -> None:
    """LocalSignals: a real SIGUSR1 sets the flag (nothing else happens); disarm puts SIG_DFL back."""
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    watcher = LocalSignals("SIGUSR1")
    watcher.arm()
    try:
        assert not watcher.requested()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watcher.requested() and watcher.signum == signal.SIGUSR1 and watcher.signalled_at is not None
    finally:
        watcher.disarm()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_handler_the_user_installed_is_left_alone() -> None:
    """A signal that already has a handler is not taken over (nor removed at disarm)."""

    def mine(signum, frame) -> None:
        pass

    previous = signal.signal(signal.SIGUSR2, mine)
    try:
        watcher = LocalSignals(["SIGUSR2"])
        watcher.arm()
        assert signal.getsignal(signal.SIGUSR2) is mine
        watcher.disarm()
        assert signal.getsignal(signal.SIGUSR2) is mine
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_make_sync_reads_the_parameters_and_the_role() -> None:
    """make_sync: ckpt_preempt_check, the signals and the exit code from the job's parameters."""
    params = {"ckpt_preempt_check": 4, "ckpt_preempt_exit_code": 3, "ckpt_preempt_signals": "SIGUSR1,SIGTERM"}
    cfg = CkptConfig.from_params(params)
    sync = make_sync(cfg, Engine(), lambda: None, None, WorkerInfo("worker", 1, 2, False), OpsLog(None), params)
    assert sync.agreement.every == 4 and sync.agreement.multi
    assert sync.exit_code == 3
    assert sync.watcher.signals == [signal.SIGUSR1, signal.SIGTERM]
    assert sync.who == "worker worker:1 "
