"""One training run's lifecycle (engine/run.py): the lock, the group's scope, the controller, every signal handler.

A real CheckpointEngine on a temporary directory and a capture of a few bytes: no framework. Several ranks are
threads of this process over one in-memory store (ThreadGroup), as in test_notice_agreement.
"""

from __future__ import annotations

import ast
import pathlib
import signal
import threading
from pathlib import Path

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import CheckpointSaveError, DirectoryLocked
from candle_ckpt.core.group import ROOT, SOLO
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.engine.notice import NoticeAgreement
from candle_ckpt.engine.preempt import PreemptExit
from candle_ckpt.engine.run import TrainingRun
from candle_ckpt.engine.signals import EXIT, WATCH, hold_signals, process_signals
from candle_ckpt.storage.store import FileSpec
from candle_ckpt.testing.groups import ThreadGroup

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "candle_ckpt"


def capture() -> Capture:
    return Capture(files=[FileSpec("model.bin", lambda f: f.write(b"weights"))], model_file="model.bin", nbytes=7)


def config(tmp_path: Path, **params) -> CkptConfig:
    base = {"ckpt_directory": str(tmp_path / "run"), "ckpt_save_interval": 1, "ckpt_deadline": "none"}
    return CkptConfig.from_params({**base, **params}).resolved()


def make_run(cfg: CkptConfig, group=SOLO, **kwargs) -> TrainingRun:
    log = OpsLog(None)
    engine = CheckpointEngine(cfg, log, group=group)
    engine.close()  # the front ends open it for each run
    return TrainingRun(cfg, engine, log, group=group, **kwargs)


def handler(signum: int):
    return signal.getsignal(signum)


def locked(cfg: CkptConfig) -> bool:
    """Whether another writer is refused the directory now."""
    try:
        CheckpointEngine(cfg, OpsLog(None)).close()
    except DirectoryLocked:
        return True
    return False


def test_the_run_holds_the_lock_and_the_signals_from_begin_to_end(tmp_path: Path) -> None:
    """begin() takes the writer lock and installs the preemption handler; end() puts back what was there."""
    cfg = config(tmp_path, ckpt_preempt_signals="SIGUSR1")
    run = make_run(cfg)
    before = handler(signal.SIGUSR1)
    assert not locked(cfg)
    run.begin()
    assert locked(cfg)
    assert handler(signal.SIGUSR1) == run.signals._handle and run.signals.role(signal.SIGUSR1) == WATCH
    assert not run.epoch_end(1, {"val_loss": 1.0}, capture, last_epoch=False)
    run.end()
    assert handler(signal.SIGUSR1) == before and not locked(cfg)
    assert (tmp_path / "run" / "ckpts" / "epochs" / "001").is_dir()


@pytest.mark.parametrize("signals", ["SIGTERM", "SIGUSR1"])
def test_sigterm_has_one_owner_in_an_async_run(tmp_path: Path, signals: str) -> None:
    """With asynchronous writes, SIGTERM is the watcher's when it is a preemption signal, else it becomes
    SystemExit; the one owner installs either; after the run, its default action again."""
    cfg = config(tmp_path, ckpt_preempt_signals=signals, ckpt_async=True)
    run = make_run(cfg)
    assert handler(signal.SIGTERM) == signal.SIG_DFL
    run.begin()
    assert handler(signal.SIGTERM) == run.signals._handle
    assert run.signals.role(signal.SIGTERM) == (WATCH if signals == "SIGTERM" else EXIT)
    run.end()
    assert handler(signal.SIGTERM) == signal.SIG_DFL


def test_a_signal_held_since_restart_is_saved_at_the_first_step(tmp_path: Path) -> None:
    """hold_signals() (restart()) holds SIGUSR1 until the run begins; the run's watcher takes it over and the
    first step saves a step checkpoint, then exits with 128 + the signal (the lock and the handler given back)."""
    cfg = config(tmp_path, ckpt_preempt_signals="SIGUSR1")
    try:
        assert hold_signals(cfg) == ["SIGUSR1"]
        signal.raise_signal(signal.SIGUSR1)  # held: the process goes on
        run = make_run(cfg)
        run.begin()
        with pytest.raises(PreemptExit) as info:
            run.step_end(0, 1, {"val_loss": 0.5}, capture)
    finally:
        process_signals().teardown(deliver=False)
    assert info.value.code == 128 + signal.SIGUSR1
    assert run.saved_at == (0, 1) and run.engine.stats()["preempt"]["reason"] == "SIGUSR1"
    assert handler(signal.SIGUSR1) == signal.SIG_DFL and not locked(cfg)
    assert [p.name for p in (tmp_path / "run" / "ckpts" / "steps").iterdir()] == ["001"]


def test_an_epoch_end_alone_without_a_deadline_asks_the_controller_only_with_a_request(tmp_path: Path) -> None:
    """One process, no deadline: an epoch end does not ask the controller until a signal is pending
    (docs/architecture.rst, "Walks"); then that epoch's checkpoint answers it. A deadline makes every epoch end ask."""
    run = make_run(config(tmp_path, ckpt_preempt_signals="SIGUSR1"))
    controller, asked = run.controller, []
    real = controller.epoch_end
    controller.epoch_end = lambda done, *args, **kwargs: asked.append(done) or real(done, *args, **kwargs)
    run.begin()
    assert not controller.asks_each_epoch
    assert not run.epoch_end(1, {"val_loss": 1.0}, capture, last_epoch=False) and asked == []
    signal.raise_signal(signal.SIGUSR1)
    assert not run.step_end(1, 4, {"val_loss": 0.9}, capture, last=True)  # the epoch's last step: the epoch answers
    with pytest.raises(PreemptExit) as info:
        run.epoch_end(2, {"val_loss": 0.9}, capture, last_epoch=False)
    assert info.value.code == 128 + signal.SIGUSR1 and asked == [2] and run.saved_at == (2, 0)
    assert run.engine.stats()["preempt"]["reason"] == "SIGUSR1" and not locked(run.cfg)
    timed = make_run(config(tmp_path / "timed", ckpt_preempt_signals="SIGUSR1", ckpt_deadline="+3600"))
    timed.begin()
    assert timed.controller.asks_each_epoch
    timed.end()


def test_hold_signals_holds_nothing_with_checkpointing_off(tmp_path: Path) -> None:
    assert hold_signals(config(tmp_path, ckpt_save_interval=0, ckpt_preempt_signals="SIGUSR1")) == []
    assert handler(signal.SIGUSR1) == signal.SIG_DFL


def test_a_failed_save_gives_the_signals_and_the_lock_back_at_once(tmp_path: Path) -> None:
    """ckpt_on_error=raise: the error propagates, and the run has ended (no end() needed)."""
    cfg = config(tmp_path, ckpt_preempt_signals="SIGUSR1", ckpt_on_error="raise")
    run = make_run(cfg)
    run.begin()

    def broken() -> Capture:
        raise OSError("disk full")

    with pytest.raises(CheckpointSaveError):
        run.epoch_end(1, {"val_loss": 1.0}, broken, last_epoch=False)
    assert handler(signal.SIGUSR1) == signal.SIG_DFL and not locked(cfg)
    run.end(ok=False)  # a front end's finally after that: nothing more happens
    assert not locked(cfg)


def test_the_controller_reads_the_parameters_and_the_role(tmp_path: Path) -> None:
    """The signals, the deadline, the exit code and the name in the log line (a job of several: the given name,
    else "process R"; one process: none); checkpointing off catches nothing."""
    params = {"ckpt_preempt_exit_code": 3, "ckpt_preempt_signals": "SIGUSR1,SIGTERM", "ckpt_deadline": "+3600"}
    second = ThreadGroup(2).members[1]
    run = make_run(config(tmp_path, **params), group=second, who="worker worker:1")
    pre = run.controller
    assert pre.cfg.preempt_exit_code == 3 and pre.who == "worker worker:1 "
    assert sorted(pre.watcher.signals) == sorted([signal.SIGUSR1, signal.SIGTERM])
    assert 3500 < pre.watcher.time_left() <= 3600
    assert run.enabled
    assert make_run(config(tmp_path / "p", **params), group=second).controller.who == "process 1 "
    assert make_run(config(tmp_path / "one", **params), who="worker worker:0").controller.who == ""
    off = make_run(config(tmp_path / "off", **params, ckpt_save_interval=0))
    assert not off.enabled


def test_each_run_of_a_group_meets_in_its_own_scope_and_leaves_no_key(tmp_path: Path) -> None:
    """Two ranks, two runs each: every run gets a fresh scope with its own agreement, the runs' saves meet in
    it, and the last meeting of each run deletes its keys (only the ranks' scope counters stay)."""
    hub = ThreadGroup(2)
    results: dict[int, list] = {}

    def rank(r: int) -> None:
        cfg = config(tmp_path, ckpt_preempt_signals="SIGUSR1")
        group = hub.members[r]
        log = OpsLog(None)
        engine = CheckpointEngine(cfg, log, group=group, scratch_dir=None if r == 0 else str(tmp_path / f"s{r}"))
        engine.close()
        run = TrainingRun(cfg, engine, log, group=group)
        seen = []
        for _ in (1, 2):
            run.begin()  # off the main thread: no handler is installed; the deadline and the agreement still run
            seen.append((run.fit_group.prefix, isinstance(run.controller.agreement, NoticeAgreement)))
            run.end()
        results[r] = seen

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert results[0] == results[1]
    prefixes = [p for p, _ in results[0]]
    assert len(set(prefixes)) == 2 and all(agreed for _, agreed in results[0])
    left = [k for k in hub.store.keys(ROOT + "/") if not k.startswith(f"{ROOT}/opened/")]
    assert left == []


# The classes that install a handler, take the lock's release or watch a fit, and who may make them.
OWNED = {
    "SignalOwner",
    "FitGuard",
    "InterruptNotice",
    "PreemptionController",
    "PreemptionWatcher",
    "StepPlan",
    "Watchdog",
    "watched",
}
ALLOWED = {
    "candle_ckpt/engine/run.py",  # the owner
    "candle_ckpt/engine/preempt_control.py",  # the controller makes its watcher
    "candle_ckpt/engine/signals.py",  # the process's one signal owner
    "candle_ckpt/engine/restore.py",  # the restore driver watches its own reads (phase restore): no run exists yet
    "candle_ckpt/engine/engine.py",  # the directory's opening, watched for its length (phase open): made before a run
}


def test_only_the_training_run_makes_the_lifecycle_pieces() -> None:
    """No front end builds a signal handler, a fit guard, the Ctrl-C notice or a controller of its own: they
    are made in engine/run.py only (the watcher by the controller; the restore's own watchdog by the restore
    driver and the opening's by the engine, both before any run exists), so each is installed in one place."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in OWNED and name not in defined and rel not in ALLOWED:
                    wrong.append(f"{rel}:{node.lineno} calls {name}")
    assert not wrong, wrong
