"""The crash-loop rule and the history's tiers, on records written by hand (no training)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import history as H
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine import restart_history as R


def setup(tmp_path: Path, **params) -> tuple[CkptConfig, R.History]:
    cfg = CkptConfig.from_params({"ckpt_directory": str(tmp_path / "save"), "epochs": 10, **params})
    os.makedirs(tmp_path / "save" / "ckpts")
    return cfg, R.History(cfg, OpsLog(str(tmp_path / "save" / "ckpt.log")), writes=True)


def resume(history: R.History, name: str | None, process: str) -> None:
    history.append(H.new_record("restart", resumed=name, process=process))
    history.append(H.new_record("failure", error="ValueError: nan", process=process))


def side(epoch: int = 2, **extra) -> Sidecar:
    return Sidecar(epoch=epoch, generation=epoch, model_file="model.keras", files={}, extra=extra)


def test_the_kth_resume_in_a_row_is_refused_with_a_record_and_exit_65(tmp_path: Path) -> None:
    """Two earlier resumes of epochs/002 with no commit between: the third (K=3) exits 65 and is recorded."""
    cfg, history = setup(tmp_path)
    resume(history, None, "a")
    resume(history, "epochs/002", "b")
    R.refuse_crash_loop(cfg, history, history.records(), "epochs/002", side())  # the second resume: allowed
    resume(history, "epochs/002", "c")
    with pytest.raises(SystemExit, match="65"):
        R.refuse_crash_loop(cfg, history, history.records(), "epochs/002", side())
    refused = history.records()[-1]
    assert (refused["event"], refused["count"], refused["last_failure"]) == ("refused", 3, "ValueError: nan")
    assert "refused: epochs/002 has been resumed 3 times in a row" in (tmp_path / "save" / "ckpt.log").read_text()
    R.refuse_crash_loop(cfg, history, history.records(), "epochs/002", side())  # the refusal ended the count


def test_progress_a_finished_run_one_process_and_k0_are_never_refused(tmp_path: Path) -> None:
    """A newer checkpoint between resumes, a finished run's checkpoint, several restarts of one process and
    ckpt_max_no_progress_restarts=0 never refuse."""
    cfg, history = setup(tmp_path)
    for n, name in enumerate(["epochs/001", "epochs/002", "steps/007", "epochs/003"]):
        resume(history, name, f"p{n}")
    R.refuse_crash_loop(cfg, history, history.records(), "epochs/003", side(3))
    for _ in range(3):
        history.append(H.new_record("restart", resumed="epochs/004", process="same"))
    R.refuse_crash_loop(cfg, history, history.records(), "epochs/004", side(4))  # one process: one start
    for n in range(3):
        resume(history, "epochs/010", f"q{n}")
    R.refuse_crash_loop(cfg, history, history.records(), "epochs/010", side(10))  # epochs=10: finished
    R.refuse_crash_loop(cfg, history, history.records(), "epochs/005", side(5, finished=["EarlyStopping", 5]))
    off, _ = setup(tmp_path / "off", ckpt_max_no_progress_restarts=0)
    R.refuse_crash_loop(off, history, history.records(), "epochs/010", side(4))


def test_the_persistent_copy_is_merged_and_a_completion_adds_to_its_record(tmp_path: Path) -> None:
    """With a persistent tier both copies are written and read back merged; a later line with a record's id
    completes that record (the first step's time) instead of adding a restart."""
    cfg, history = setup(tmp_path, ckpt_persistent_url=str(tmp_path / "persistent"))
    record = H.new_record("restart", resumed="epochs/002", start={"import_s": 1.0}, process="a")
    history.append(record)
    history.append({**record, "start": {"import_s": 1.0, "first_step_s": 0.5}})
    (tmp_path / "save" / "ckpts" / "restarts.jsonl").unlink()  # a moved run: only the persistent copy is left
    (merged,) = history.records()
    assert merged["start"] == {"import_s": 1.0, "first_step_s": 0.5} and merged["id"] == record["id"]
    assert H.restarts(H.read_local(str(tmp_path / "persistent" / "restarts.jsonl"))) == [merged]


def test_the_process_start_time_comes_from_the_os() -> None:
    """/proc gives this process's start: in the past, and not before the interpreter started importing."""
    started = R.process_start_time()
    assert started is not None
    import time

    assert 0 <= time.time() - started < 3600


def hung(history: R.History, name: str | None, process: str, error: str = "hang", phase: str = "restore") -> None:
    """A start that resumed (or was reading) ``name`` and failed as given (by default: hung in its restore)."""
    start = H.new_record("restart", resumed=name, process=process)
    history.append(start)
    history.append(H.new_record("failure", restart=start["id"], error=error, phase=phase, process=process))


def test_restores_that_hung_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    """Two starts in a row whose read of epochs/002 never returned (the restore's watchdog): the third start (K=3)
    exits 65 at once, naming the checkpoint and the count, with a refused record that ends the count."""
    cfg, history = setup(tmp_path)
    hung(history, "epochs/002", "a")
    R.refuse_hung_restore(cfg, history, history.records())  # one hang: the second start may try
    hung(history, "epochs/002", "b")
    assert H.hung_restores(history.records()) == (2, "epochs/002")
    with pytest.raises(SystemExit, match="65"):
        R.refuse_hung_restore(cfg, history, history.records())
    refused = history.records()[-1]
    assert (refused["event"], refused["resumed"], refused["count"]) == ("refused", "epochs/002", 3)
    assert refused["last_failure"] == "hang in phase restore"
    log = (tmp_path / "save" / "ckpt.log").read_text()
    assert "refused: reading epochs/002 hung in the last 2 starts in a row" in log
    assert "ckpt_max_no_progress_restarts=3" in log and "exit status 65" in log
    R.refuse_hung_restore(cfg, history, history.records())  # the refusal ended the count


def test_a_restore_hang_count_ends_at_progress_or_another_failure_and_skips_a_kill(tmp_path: Path) -> None:
    """hung_restores counts back from the newest start: a progress record or a start that failed otherwise (a
    crash in fit, a hang in a step) ends the count; a start with no record of its own (SIGKILL) is passed over;
    the name is the newest hang's (None: it hung before it knew which checkpoint)."""
    _, history = setup(tmp_path)
    hung(history, "epochs/001", "a")
    hung(history, "epochs/001", "b")
    history.append(H.new_record("progress", process="b"))
    assert H.hung_restores(history.records()) == (0, None)
    hung(history, "epochs/002", "c")
    history.append(H.new_record("restart", resumed="epochs/002", process="d", host="elsewhere", pid=1))  # killed
    hung(history, None, "e")
    assert H.hung_restores(history.records()) == (2, None)
    hung(history, "epochs/002", "f", error="ValueError: nan", phase="step")
    assert H.hung_restores(history.records()) == (0, None)
    hung(history, "epochs/002", "g", phase="step")
    assert H.hung_restores(history.records()) == (0, None)


def test_restore_hangs_are_never_refused_with_k0_or_by_the_process_that_resumed(tmp_path: Path) -> None:
    """ckpt_max_no_progress_restarts=0 never refuses; nor does a second restart() of a process already counted."""
    cfg, history = setup(tmp_path, ckpt_max_no_progress_restarts=0)
    for process in "abcd":
        hung(history, "epochs/002", process)
    R.refuse_hung_restore(cfg, history, history.records())
    cfg, history = setup(tmp_path / "again")
    for process in "ab":
        hung(history, "epochs/002", process)
    history.append(H.new_record("restart", resumed="epochs/002", process=R.process_token()))
    R.refuse_hung_restore(cfg, history, history.records())
