"""EIO from fsync and from every other file-system step of a save (the "fsyncgate" lesson).

After a failed fsync the data of that file cannot be trusted, so the whole
save must fail, undo itself, and never carry on as if the fsync had worked.
Core only: the files written are plain bytes, no keras.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from locations import FIGURES

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import CheckpointSaveError
from candle_ckpt.core.fs import read_link
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.engine import CheckpointEngine
from candle_ckpt.storage.store import FileSpec
from candle_ckpt.testing.faultfs import FaultFS


def payload(epoch: int) -> bytes:
    return bytes((epoch * 7 + i) % 251 for i in range(5000))


def capture(epoch: int) -> Capture:
    def write_weights(f) -> None:
        data = payload(epoch)
        for i in range(0, len(data), 2000):  # several writes, like h5py
            f.write(data[i : i + 2000])

    files = [FileSpec("model.weights.h5", write_weights), FileSpec("model.keras", lambda f: f.write(b"zip" * 100))]
    return Capture(files=files, model_file="model.weights.h5", nbytes=5300)


def make_engine(root: Path, fs: FaultFS, on_error: str = "raise") -> CheckpointEngine:
    cfg = CkptConfig.from_params(
        {"ckpt_directory": str(root), "epochs": 10, "ckpt_save_best_metric": "loss", "ckpt_on_error": on_error}
    )
    return CheckpointEngine(cfg, OpsLog(str(root / "ckpt.log")), fs=fs)


def count_ops(tmp_path: Path, kinds: tuple[str, ...]) -> int:
    root = tmp_path / "count"
    fs = FaultFS()
    engine = make_engine(root, fs)
    engine.save(1, {"loss": 1.0}, lambda: capture(1))
    fs.arm(kinds, 10**9)
    engine.save(2, {"loss": 0.5}, lambda: capture(2))
    engine.store.close()
    return fs.seen


def run_fault(root: Path, kinds: tuple[str, ...], k: int) -> tuple[FaultFS, CheckpointEngine]:
    """Save epochs 1 and 2, then save epoch 3 with EIO at the k-th op of ``kinds``; check nothing moved."""
    fs = FaultFS()
    engine = make_engine(root, fs)
    engine.save(1, {"loss": 1.0}, lambda: capture(1))
    engine.save(2, {"loss": 0.5}, lambda: capture(2))
    ckpts = root / "ckpts"
    fs.arm(kinds, k)
    with pytest.raises(CheckpointSaveError, match=r"epoch 3: checkpoint save failed: OSError: \[Errno 5\] injected"):
        engine.save(3, {"loss": 0.1}, lambda: capture(3))
    where = f"EIO at {fs.failed}"
    assert read_link(str(ckpts / "last")) == "epochs/002", where
    assert read_link(str(ckpts / "best")) == "epochs/002", where
    assert engine.store.epochs() == [1, 2], where
    assert sorted(os.listdir(ckpts)) == ["best", "epochs", "last", "lock"], where
    for epoch in (1, 2):
        _, contents = engine.store.verify(epoch, reads=["model.weights.h5"])
        assert contents["model.weights.h5"] == payload(epoch), where
    return fs, engine


def test_eio_from_any_fsync_fails_the_save_and_is_never_trusted(tmp_path: Path) -> None:
    """EIO from any fsync of a save fails it, leaves last/best and epochs/ as they were, and the same file is not
    fsynced again by that save; the next save writes every file anew and succeeds."""
    kinds = ("fsync", "fsync_dir")
    total = count_ops(tmp_path, kinds)
    assert total >= 6, f"a save made only {total} fsyncs"
    for k in range(1, total + 1):
        root = tmp_path / f"fsync{k}"
        fs, engine = run_fault(root, kinds, k)
        op, path = fs.failed
        after = fs.ops[fs.failed_index + 1 :]
        # fsyncgate: the failed file is never fsynced again, and nothing is published after the failure
        assert ("fsync", path) not in after, f"{path} was fsynced again after EIO: {after}"
        new_dir = str(root / "ckpts" / "epochs" / "003")
        published = [(o, p) for o, p in after if o in ("rename", "replace") and p == new_dir]
        assert published == [], f"epochs/003 was published after EIO at {op} {path}: {after}"
        fs.arm((), 0)
        assert engine.save(3, {"loss": 0.1}, lambda: capture(3)) is True
        created = [p for o, p in fs.ops if o == "create"]
        assert [os.path.basename(p) for p in created[:3]] == ["model.weights.h5", "model.keras", "ckpt-info.json"]
        assert read_link(str(root / "ckpts" / "last")) == "epochs/003"
        _, contents = engine.store.verify(3, reads=["model.weights.h5"])
        assert contents["model.weights.h5"] == payload(3)
        engine.store.close()
    _figure("fsync_fault_points", total)


def test_eio_from_any_other_step_fails_the_save_cleanly(tmp_path: Path) -> None:
    """EIO from any create, write, mkdir, rename, replace, symlink of a save fails it and leaves the store as it was."""
    kinds = ("create", "write", "mkdir", "rename", "replace", "symlink")
    total = count_ops(tmp_path, kinds)
    assert total >= 10, f"a save made only {total} such operations"
    for k in range(1, total + 1):
        _, engine = run_fault(tmp_path / f"op{k}", kinds, k)
        engine.store.close()
    _figure("other_fault_points", total)


def test_eio_with_on_error_warn_continues_and_logs(tmp_path: Path) -> None:
    """With ckpt_on_error=warn an fsync EIO is reported in ckpt.log and stats(), the save returns False, training
    goes on, and the next save succeeds."""
    fs = FaultFS()
    engine = make_engine(tmp_path, fs, on_error="warn")
    engine.save(1, {"loss": 1.0}, lambda: capture(1))
    fs.arm(("fsync",), 1)
    assert engine.save(2, {"loss": 0.5}, lambda: capture(2)) is False
    assert engine.stats()["errors"] == [
        f"epoch 2: checkpoint save failed: OSError: [Errno 5] injected EIO at step {fs.failed_index} in fsync: "
        f"'{fs.failed[1]}'"
    ]
    assert "ckpt_on_error=warn: training continues" in (tmp_path / "ckpt.log").read_text()
    assert read_link(str(tmp_path / "ckpts" / "last")) == "epochs/001"
    fs.arm((), 0)
    assert engine.save(3, {"loss": 0.4}, lambda: capture(3)) is True
    assert engine.store.epochs() == [1, 3]
    engine.store.close()


@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_ctrl_c_during_a_save_stays_a_keyboard_interrupt_and_changes_nothing(tmp_path: Path, on_error: str) -> None:
    """A KeyboardInterrupt in the middle of a save (Ctrl-C while a file is written) reaches the script as itself,
    in either ckpt_on_error mode (warn must not swallow it), is no save error, and leaves the store as it was."""
    engine = make_engine(tmp_path, FaultFS(), on_error=on_error)
    engine.save(1, {"loss": 1.0}, lambda: capture(1))

    def interrupted(f) -> None:
        f.write(payload(2)[:2000])
        raise KeyboardInterrupt

    cap = Capture(files=[FileSpec("model.weights.h5", interrupted)], model_file="model.weights.h5", nbytes=5000)
    with pytest.raises(KeyboardInterrupt):
        engine.save(2, {"loss": 0.5}, lambda: cap)
    assert engine.stats()["errors"] == []
    log = (tmp_path / "ckpt.log").read_text()
    assert "epoch 2: checkpoint save interrupted (KeyboardInterrupt); nothing of it is kept" in log
    assert "ERROR" not in log and "WARNING" not in log, log
    assert read_link(str(tmp_path / "ckpts" / "last")) == "epochs/001"
    assert engine.store.epochs() == [1]
    work = tmp_path / "ckpts" / "work"
    assert not work.exists() or os.listdir(work) == [], "the interrupted save left files in work/"
    assert engine.save(3, {"loss": 0.4}, lambda: capture(3)) is True
    assert engine.store.epochs() == [1, 3]
    engine.store.close()


def _figure(key: str, value: int) -> None:
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / "io_errors.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"\nio errors: {key} = {value}")
