"""File systems without symlinks: ``best``/``last`` become pointer files, written as atomically as symlinks."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from pathlib import Path

import numpy as np
from testkit import build_model  # noqa: E402

from candle_ckpt.core.fs import read_link
from candle_ckpt.keras.callback import CandleCheckpointCallback
from candle_ckpt.keras.restart import restart
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.crashsim import NoSymlinkFS

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 8)).astype("float32")
Y = RNG.normal(size=(32, 1)).astype("float32")


class StepsFS(NoSymlinkFS):
    """No symlinks, and every step recorded."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, str]] = []

    def hook(self, op: str, path: str) -> None:
        self.ops.append((op, os.path.basename(path)))


def test_pointer_file_is_written_with_temp_file_fsync_replace_fsync_dir(tmp_path: Path) -> None:
    """Where symlink raises EPERM, set_link writes a temp pointer file, fsyncs it, os.replace-s it over the link
    and fsyncs ckpts/, in that order."""
    store = CheckpointStore(tmp_path, fs=StepsFS())
    os.makedirs(store.layout.epoch_dir(3))
    store.set_link("last", 3)
    ops = store.fs.ops
    tmp = ops[0][1]
    assert tmp.startswith(".tmp-last-")
    assert ops == [
        ("symlink", tmp),
        ("create", tmp),
        ("write", tmp),
        ("fsync", tmp),
        ("replace", "last"),
        ("fsync_dir", "ckpts"),
    ]
    last = Path(store.layout.link("last"))
    assert not last.is_symlink() and last.read_text() == "epochs/003\n"
    assert sorted(os.listdir(store.layout.ckpts)) == ["epochs", "last"]


def test_restart_reads_either_form_and_forms_can_alternate(tmp_path: Path) -> None:
    """Training that alternates between a file system without symlinks and one with them leaves last/best in the
    form of the latest save, and restart() resumes the latest epoch each time, bit for bit."""
    params = {"ckpt_directory": str(tmp_path), "epochs": 4, "ckpt_save_best_metric": "loss"}
    model = build_model(1)
    forms = []
    for epoch, fs in enumerate([NoSymlinkFS(), None, NoSymlinkFS(), None], start=1):
        cb = CandleCheckpointCallback(params, logger=None, verbose=False, fs=fs)
        model.fit(X, Y, initial_epoch=epoch - 1, epochs=epoch, batch_size=8, shuffle=False, verbose=0, callbacks=[cb])
        cb.engine.store.close()
        last = tmp_path / "ckpts" / "last"
        forms.append("symlink" if last.is_symlink() else "pointer")
        assert read_link(str(last)) == f"epochs/{epoch:03d}"
        fresh = build_model(1)
        fresh.build((None, 8))
        got = restart(params, fresh, logger=None, verbose=False)
        assert got["epoch"] == epoch
        for a, b in zip(fresh.weights, model.weights, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert forms == ["pointer", "symlink", "pointer", "symlink"]
