"""Hostile or broken checkpoint directories: refused with a clear message, never followed.

A canary tree outside ``ckpt_directory`` holds files that would be loaded if
a path were followed out; the tests check they are never used, written or
deleted.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import hashlib
import json
import re
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from locations import PACKAGE
from testkit import build_model  # noqa: E402

from candle_ckpt.core import layout as L
from candle_ckpt.core.checksum import crc32, format_crc
from candle_ckpt.core.errors import NoValidCheckpoint
from candle_ckpt.core.fs import read_link
from candle_ckpt.core.sidecar import _canonical
from candle_ckpt.keras.callback import CandleCheckpointCallback
from candle_ckpt.keras.restart import restart
from candle_ckpt.storage.store import CheckpointStore

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 8)).astype("float32")
Y = RNG.normal(size=(32, 1)).astype("float32")


def weights_of(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.weights]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, dict[int, list[np.ndarray]]]:
    """A job directory with epochs 1..3 committed by a real fit, and the weights of each epoch."""
    root = tmp_path_factory.mktemp("base") / "job"
    params = {"ckpt_directory": str(root), "epochs": 3, "ckpt_save_best_metric": "loss"}
    cb = CandleCheckpointCallback(params, logger=None, verbose=False)
    model = build_model(1)
    seen = {}

    class Keep(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen[epoch + 1] = weights_of(model)

    model.fit(X, Y, epochs=3, batch_size=8, shuffle=False, verbose=0, callbacks=[cb, Keep()])
    cb.engine.store.close()
    return root, seen


@pytest.fixture
def job(base, tmp_path: Path):
    """A fresh copy of the base job under tmp/job, a canary tree under tmp/outside, and their digest."""
    root = tmp_path / "job"
    shutil.copytree(base[0], root, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    epoch1 = root / "ckpts" / "epochs" / "001"
    (outside / "x").write_bytes((epoch1 / L.MODEL_FILE).read_bytes())  # loadable state of epoch 1
    shutil.copytree(epoch1, outside / "ckpt")  # a valid checkpoint of epoch 1
    shutil.copytree(epoch1, outside / "ckpt9")
    rewrite_sidecar(outside / "ckpt9", epoch=9, generation=99)  # would win if it were ever listed
    return root, outside, tree_digest(outside)


def tree_digest(path: Path) -> dict[str, tuple]:
    return {
        str(p.relative_to(path)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def rewrite_sidecar(directory: Path, **changes) -> None:
    """Change sidecar fields and re-sign it with a correct CRC (so only the field checks can refuse it)."""
    path = directory / L.SIDECAR
    body = json.loads(path.read_text())
    body.pop("sidecar_crc32")
    body.update(changes)
    body["sidecar_crc32"] = format_crc(crc32(_canonical(body)))
    path.write_text(json.dumps(body))


def do_restart(root: Path, **extra):
    model = build_model(1)
    got = restart({"ckpt_directory": str(root), **extra}, model, logger=None, verbose=False)
    return got, model


def set_model_file(root: Path, name: str) -> None:
    epoch3 = root / "ckpts" / "epochs" / "003"
    body = json.loads((epoch3 / L.SIDECAR).read_text())
    entry = body["files"].pop(body["model_file"])
    rewrite_sidecar(epoch3, model_file=name, files={**body["files"], name: entry})


def hostile_cases(outside: Path) -> dict:
    x = str(outside / "x")
    return {
        "model_file ../../x": (lambda r: set_model_file(r, "../../x"), "is not a plain file name"),
        "model_file absolute": (lambda r: set_model_file(r, x), "is not a plain file name"),
        "sidecar not JSON": (
            lambda r: (r / "ckpts/epochs/003" / L.SIDECAR).write_bytes(b"\x00{not json"),
            "not valid JSON",
        ),
        "sidecar JSON array": (lambda r: (r / "ckpts/epochs/003" / L.SIDECAR).write_text("[1, 2]"), "JSON object"),
        "sidecar huge": (
            lambda r: (r / "ckpts/epochs/003" / L.SIDECAR).write_bytes(b" " * (3 << 20) + b"{}"),
            "larger than the 1048576 allowed",
        ),
    }


CASES = ["model_file ../../x", "model_file absolute", "sidecar not JSON", "sidecar JSON array", "sidecar huge"]


@pytest.mark.parametrize("case", CASES)
def test_hostile_sidecar_is_refused_and_the_previous_checkpoint_resumed(job, base, case: str) -> None:
    """A hostile or broken sidecar of epoch 3 is refused, named in ckpt.log, and restart() resumes epoch 2."""
    root, outside, digest = job
    mutate, reason = hostile_cases(outside)[case]
    mutate(root)
    got, model = do_restart(root)
    assert got["epoch"] == 2
    for a, b in zip(weights_of(model), base[1][2], strict=True):
        np.testing.assert_array_equal(a, b)
    log = (root / "ckpt.log").read_text()
    assert re.search(rf"skipping epoch 3: .*ckpt-info.json: .*{re.escape(reason)}", log), log
    assert tree_digest(outside) == digest


@pytest.mark.parametrize("case", CASES)
def test_hostile_sidecar_with_explicit_restart_epoch_raises(job, case: str) -> None:
    """ckpt_restart_epoch naming a checkpoint with a hostile sidecar raises NoValidCheckpoint saying why."""
    root, outside, digest = job
    mutate, reason = hostile_cases(outside)[case]
    mutate(root)
    with pytest.raises(
        NoValidCheckpoint, match=rf"ckpt_restart_epoch=3: checkpoint is not valid: .*{re.escape(reason)}"
    ):
        do_restart(root, ckpt_restart_epoch=3)
    assert tree_digest(outside) == digest


@pytest.mark.parametrize("link", ["last", "best"])
@pytest.mark.parametrize("form", ["absolute", "dotdot", "dotdot-inside"])
def test_links_pointing_outside_are_never_followed(job, base, link: str, form: str) -> None:
    """A last/best link (symlink or pointer file) leading outside ckpts/epochs/ is ignored with a warning."""
    root, outside, digest = job
    target = {
        "absolute": str(outside / "ckpt"),
        "dotdot": "../../outside/ckpt",
        "dotdot-inside": "epochs/../../../outside/ckpt",
    }[form]
    path = root / "ckpts" / link
    path.unlink()
    os.symlink(target, path)
    got, model = do_restart(root)
    assert got["epoch"] == 3  # last ignored: the newest commit generation is resumed, never the outside copy
    for a, b in zip(weights_of(model), base[1][3], strict=True):
        np.testing.assert_array_equal(a, b)
    if link == "last":
        assert "which is outside" in _store_warnings(root)
    assert tree_digest(outside) == digest


def _store_warnings(root: Path) -> str:
    import logging

    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Grab()
    logging.getLogger("candle_ckpt.storage").addHandler(handler)
    try:
        CheckpointStore(root).link_epoch("last")
    finally:
        logging.getLogger("candle_ckpt.storage").removeHandler(handler)
    return "\n".join(records)


def test_pointer_file_pointing_outside_is_never_followed(job) -> None:
    """A pointer-file last holding an absolute path is ignored; restart() resumes by commit order."""
    root, outside, digest = job
    last = root / "ckpts" / "last"
    last.unlink()
    last.write_text(str(outside / "ckpt") + "\n")
    got, _ = do_restart(root)
    assert got["epoch"] == 3
    assert "which is outside" in _store_warnings(root)


def test_epoch_names_that_are_not_numbers_and_epoch_symlinks_are_ignored(job) -> None:
    """Entries of epochs/ that are not NNN directories (abc, 12, 0004, 004.bak, a symlink 009 -> outside) are
    never listed, verified or loaded."""
    root, outside, digest = job
    epochs = root / "ckpts" / "epochs"
    for name in ("abc", "12", "0004", "004.bak", "-05", " 006"):
        shutil.copytree(epochs / "001", epochs / name)
    os.symlink(outside / "ckpt9", epochs / "009")
    (root / "ckpts" / "last").unlink()  # so that, if 009 were listed, its generation 99 would win
    assert CheckpointStore(root).epochs() == [1, 2, 3]
    got, _ = do_restart(root)
    assert got["epoch"] == 3
    with pytest.raises(NoValidCheckpoint, match=r"ckpt_restart_epoch=9: no checkpoint .*epochs/009"):
        do_restart(root, ckpt_restart_epoch=9)
    assert tree_digest(outside) == digest


def test_training_on_a_hostile_directory_never_writes_or_deletes_outside(job) -> None:
    """Resuming and training with pruning (keep_limit=1) on a directory whose links and an epoch entry point
    outside replaces the links, prunes only inside, and leaves the canary tree untouched."""
    root, outside, digest = job
    ckpts = root / "ckpts"
    (ckpts / "last").unlink()
    os.symlink(outside / "ckpt", ckpts / "last")
    (ckpts / "best").unlink()
    os.symlink("../../outside/ckpt", ckpts / "best")
    os.symlink(outside / "ckpt9", ckpts / "epochs" / "009")
    os.symlink(outside, ckpts / "trash-planted")  # debris cleaning must unlink it, not empty the target
    params = {"ckpt_directory": str(root), "epochs": 5, "ckpt_save_best_metric": "loss", "ckpt_keep_limit": 1}
    model = build_model(1)
    got = restart(params, model, logger=None, verbose=False)
    assert got["epoch"] == 3
    cb = CandleCheckpointCallback(params, logger=None, verbose=False)
    model.fit(X, Y, initial_epoch=3, epochs=5, batch_size=8, shuffle=False, verbose=0, callbacks=[cb])
    cb.engine.store.close()
    assert read_link(str(ckpts / "last")) == "epochs/005"
    assert read_link(str(ckpts / "best")).startswith("epochs/")
    assert not (ckpts / "trash-planted").exists()
    assert tree_digest(outside) == digest
    assert (outside / "ckpt9").is_dir() and (outside / "x").is_file()


def test_restart_reads_only_the_weights_never_a_model_config(job, monkeypatch) -> None:
    """restart() reads the weights member of model.keras but never builds a model from its config.json."""
    root, _, _ = job

    def refuse(*args, **kwargs):
        raise AssertionError("restart() must not deserialize a model from a checkpoint")

    import keras.src.saving.saving_lib as saving_lib

    monkeypatch.setattr(keras.saving, "load_model", refuse)
    monkeypatch.setattr(keras.models, "load_model", refuse)
    monkeypatch.setattr(saving_lib, "load_model", refuse)
    monkeypatch.setattr(saving_lib, "_model_from_config", refuse)
    monkeypatch.setattr(keras.saving, "deserialize_keras_object", refuse)
    monkeypatch.setattr(keras.models, "model_from_json", refuse)
    got, _ = do_restart(root)
    assert got["epoch"] == 3 and got["model_file"] == L.MODEL_FILE


def test_every_load_model_call_in_the_package_uses_safe_mode() -> None:
    """Any keras load_model call in candle_ckpt passes safe_mode=True (today there is none: restart loads weights)."""
    calls = []
    for path in PACKAGE.rglob("*.py"):
        for m in re.finditer(r"load_model\((.*?)\)", path.read_text()):
            calls.append((path.name, m.group(1)))
    assert all("safe_mode=True" in args for _, args in calls), calls


def test_written_keras_archive_loads_with_safe_mode(job, base) -> None:
    """The model.keras a checkpoint holds loads with keras.saving.load_model(safe_mode=True) to the same weights."""
    root, _, _ = job
    loaded = keras.saving.load_model(root / "ckpts" / "epochs" / "002" / L.MODEL_FILE, safe_mode=True)
    for a, b in zip(weights_of(loaded), base[1][2], strict=True):
        np.testing.assert_array_equal(a, b)
