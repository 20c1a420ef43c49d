"""A full disk during real saves: a small tmpfs mounted by the test, filled to leave each amount of free space.

Skipped (with the reason) only where mounting a tmpfs is not permitted.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from locations import FIGURES
from testkit import build_model  # noqa: E402

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointSaveError
from candle_ckpt.core.fs import read_link
from candle_ckpt.keras.callback import CandleCheckpointCallback
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.faultfs import FaultFS

PAGE = 4096  # tmpfs accounts space in pages
RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 8)).astype("float32")
Y = RNG.normal(size=(32, 1)).astype("float32")


def failing_step(fs: FaultFS) -> str:
    """The last file-system step before the cleanup of work/ began (where ENOSPC hit)."""
    steps = [(op, os.path.basename(path)) for op, path in fs.ops]
    end = steps.index(("rmtree", "work")) if ("rmtree", "work") in steps else len(steps)
    return " ".join(steps[end - 1]) if end else "before any step"


@pytest.fixture
def tmpfs(tmp_path: Path):
    """A 1 MiB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill_to(mnt: Path, free: int) -> Path:
    """Write a ballast file so that exactly ``free`` bytes (rounded to pages) stay free."""
    ballast = mnt / "ballast"
    ballast.unlink(missing_ok=True)
    size = max(free_bytes(mnt) - free, 0)
    with open(ballast, "wb") as f:
        f.write(bytes(size))
    return ballast


def snapshot(store: CheckpointStore) -> dict[int, bytes]:
    """The state file (model.keras) bytes of every checkpoint, each verified against its CRC."""
    return {e: store.verify(e, reads=[L.MODEL_FILE])[1][L.MODEL_FILE] for e in store.epochs()}


def params(root: Path, epochs: int, on_error: str) -> dict:
    return {
        "ckpt_directory": str(root),
        "epochs": epochs,
        "ckpt_save_best_metric": "loss",
        "ckpt_keep_limit": 2,
        "ckpt_on_error": on_error,
    }


def test_full_disk_at_every_page_fails_cleanly_and_recovers(tmpfs: Path) -> None:
    """With the disk full at each page offset of a save, the save fails (warn: training goes on), earlier
    checkpoints stay intact, no epochs/NNN, work/ or trash is left, and after freeing space the next save succeeds."""
    root = tmpfs / "run"
    total_epochs = 200
    fs = FaultFS()
    cb = CandleCheckpointCallback(params(root, total_epochs, "warn"), logger=None, verbose=False, fs=fs)
    store = cb.engine.store
    model = build_model(1)
    fit = {"batch_size": 8, "shuffle": False, "verbose": 0, "callbacks": [cb]}
    model.fit(X, Y, epochs=1, **fit)
    save_bytes = sum(p.stat().st_size for p in Path(store.layout.epoch_dir(1)).iterdir())
    epoch, failed_at, failed_files = 1, [], set()
    for free in range(0, save_bytes + 2 * PAGE, PAGE):
        before = snapshot(store)
        last_before = read_link(store.layout.link("last"))
        ballast = fill_to(tmpfs, free)
        errors_before = len(cb.stats()["errors"])
        fs.ops.clear()
        history = model.fit(X, Y, initial_epoch=epoch, epochs=epoch + 1, **fit)
        epoch += 1
        assert len(history.history["loss"]) == 1  # training went on
        new_errors = cb.stats()["errors"][errors_before:]
        if new_errors:
            assert "No space left on device" in new_errors[0], new_errors
            failed_at.append(free)
            failed_files.add(failing_step(fs))
            assert epoch not in store.epochs(), f"free={free}: a partial epochs/{epoch:03d} is visible"
            assert read_link(store.layout.link("last")) == last_before
        assert sorted(n for n in os.listdir(store.layout.ckpts) if store.layout.is_debris(n)) == [], f"free={free}"
        after = snapshot(store)
        for e in set(before) & set(after):
            assert after[e] == before[e], f"free={free}: epoch {e} changed"
        ballast.unlink()
        errors_before = len(cb.stats()["errors"])
        model.fit(X, Y, initial_epoch=epoch, epochs=epoch + 1, **fit)
        epoch += 1
        assert cb.stats()["errors"][errors_before:] == [], f"free={free}: the save after freeing space failed"
        assert read_link(store.layout.link("last")) == f"epochs/{epoch:03d}"
        store.verify(epoch)
    store.close()
    figures = {
        "save_bytes": save_bytes,
        "free_space_points": len(range(0, save_bytes + 2 * PAGE, PAGE)),
        "failed_saves": len(failed_at),
        "failing_steps": sorted(failed_files),
    }
    _figure("disk_full", figures)
    assert len(failed_at) >= 3, figures


def test_full_disk_with_on_error_raise_stops_training(tmpfs: Path) -> None:
    """With ckpt_on_error=raise a full disk stops model.fit with CheckpointSaveError naming ENOSPC."""
    root = tmpfs / "run"
    cb = CandleCheckpointCallback(params(root, 5, "raise"), logger=None, verbose=False)
    model = build_model(1)
    fit = {"batch_size": 8, "shuffle": False, "verbose": 0, "callbacks": [cb]}
    model.fit(X, Y, epochs=1, **fit)
    ballast = fill_to(tmpfs, 0)
    with pytest.raises(
        CheckpointSaveError, match=r"epoch 2: checkpoint save failed: .*No space left on device; earlier"
    ):
        model.fit(X, Y, initial_epoch=1, epochs=2, **fit)
    assert cb.engine.store.epochs() == [1]
    ballast.unlink()
    model.fit(X, Y, initial_epoch=2, epochs=3, **fit)
    assert cb.engine.store.epochs() == [1, 3]
    cb.engine.store.close()


def _figure(key: str, value) -> None:
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / "disk_full.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"\n{key}: {value}")
