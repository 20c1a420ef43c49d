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
