"""Power loss at every step of a save (the ALICE / RocksDB fault-injection model).

A real ``model.fit`` with :class:`CandleCheckpointCallback` saves through a
:class:`~candle_ckpt.testing.crashsim.RecordingFS`. After every recorded
file-system operation the harness rebuilds what a power cut would leave
(unsynced data dropped or torn, unsynced directory entries reverted, or
directory entries persisted ahead of data), writes each distinct state to a
real directory and runs ``restart()`` on it.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json
from pathlib import Path

import keras
import numpy as np
import pytest
from locations import FIGURES
from testkit import build_model  # noqa: E402

from candle_ckpt.core import layout as L
from candle_ckpt.keras.callback import CandleCheckpointCallback
from candle_ckpt.keras.restart import restart
from candle_ckpt.keras.state import ModelState
from candle_ckpt.storage.keras_archive import weights_member_range
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.crashsim import RecordingFS, RecordingNoSymlinkFS, materialize, state_digest

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 8)).astype("float32")
Y = RNG.normal(size=(32, 1)).astype("float32")


def state_arrays(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in [*model.weights, *model.optimizer.variables]]


def zero_state(model: keras.Model) -> None:
    for v in [*model.weights, *model.optimizer.variables]:
        v.assign(np.zeros(v.shape, dtype=v.dtype))


def record_saves(root: Path, fs: RecordingFS, before: int, recorded: int, keep_limit: int):
    """Train ``before`` epochs unrecorded, then ``recorded`` more while recording; return committed weights."""
    committed: dict[int, bytes] = {}
    params = {
        "ckpt_directory": str(root),
        "epochs": before + recorded,
        "ckpt_save_best_metric": "loss",
        "ckpt_keep_limit": keep_limit,
        "ckpt_save_weights_only": False,
    }
    if before == 0:
        fs.start()  # the very first save also creates ckpts/ and epochs/
    cb = CandleCheckpointCallback(params, logger=None, verbose=False, fs=fs)
    store = cb.engine.store
    real_commit = store.commit

    def commit(epoch, *args, **kwargs):
        side = real_commit(epoch, *args, **kwargs)
        fs.mark(f"committed {epoch}")
        committed[epoch] = Path(store.layout.epoch_dir(epoch), L.MODEL_FILE).read_bytes()
        return side

    store.commit = commit
    model = build_model(1)
    if before:
        model.fit(X, Y, epochs=before, batch_size=8, shuffle=False, verbose=0, callbacks=[cb])
        fs.start()
    fit = {"batch_size": 8, "shuffle": False, "verbose": 0, "callbacks": [cb]}
    model.fit(X, Y, initial_epoch=before, epochs=before + recorded, **fit)
    fs.stop()
    store.close()
    return committed


def check_crash_states(tmp_path: Path, fs: RecordingFS, committed: dict[int, bytes], floor0: int) -> dict:
    """Run restart() on every distinct crash state; return the figures."""
    model = build_model(1)
    model.build((None, 8))
    reference = {}
    for epoch, archive in committed.items():
        start, size = weights_member_range(archive)  # the weights member of model.keras
        ModelState(model).restore(archive[start : start + size])
        reference[epoch] = state_arrays(model)
    distinct: dict[str, tuple[dict, int, str]] = {}
    points = fs.crash_states()
    for point, state in points:
        floor = max([floor0, *(int(m.split()[1]) for m in point.marks)])
        key = state_digest(state)
        old = distinct.get(key)
        if old is None or floor > old[1]:
            distinct[key] = (state, floor, f"after op {point.index} ({point.op}), {point.variant}")
    resumed: dict[int, int] = {}
    for i, (state, floor, where) in enumerate(distinct.values()):
        d = tmp_path / f"state{i}"
        materialize(state, d)
        store = CheckpointStore(d)
        for epoch in store.epochs():  # no partial epochs/NNN is ever visible
            store.verify(epoch)
        zero_state(model)
        got = restart({"ckpt_directory": str(d), "ckpt_restart_mode": "auto"}, model, logger=None, verbose=False)
        epoch = got["epoch"] if got else 0
        assert epoch >= floor, f"crash {where}: resumed epoch {epoch}, but epoch {floor} had been committed"
        if got:
            assert epoch in reference, f"crash {where}: resumed epoch {epoch} that was never committed"
            for a, b in zip(state_arrays(model), reference[epoch], strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"crash {where}: weights differ from epoch {epoch}")
        resumed[epoch] = resumed.get(epoch, 0) + 1
    return {
        "ops": len(fs.ops),
        "crash_points": len(points),
        "distinct_states": len(distinct),
        "resumed_epochs": {str(k): v for k, v in sorted(resumed.items())},
    }


def write_figures(name: str, figures: dict) -> None:
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / "power_loss.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"\npower loss [{name}]: {figures}")


SCENARIOS = {
    # (epochs before recording, epochs recorded, keep_limit, fs class)
    "fresh-directory": (0, 2, 1, RecordingFS),
    "append-and-prune": (3, 1, 2, RecordingFS),
    "pointer-files": (2, 1, 1, RecordingNoSymlinkFS),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_power_cut_resumes_a_committed_checkpoint(tmp_path: Path, name: str) -> None:
    """A power cut after any operation of a save resumes a verified checkpoint, never older than the last commit."""
    before, recorded, keep_limit, fs_cls = SCENARIOS[name]
    root = tmp_path / "run"
    root.mkdir()
    fs = fs_cls(root, seed=len(name))
    committed = record_saves(root, fs, before, recorded, keep_limit)
    assert sorted(committed) == list(range(1, before + recorded + 1))
    figures = check_crash_states(tmp_path, fs, committed, floor0=before)
    write_figures(name, figures)
    # the last save's commit returned: the final state resumes it
    assert str(before + recorded) in figures["resumed_epochs"], figures
    assert figures["crash_points"] >= 400, f"only {figures['crash_points']} crash points: {fs.ops}"
