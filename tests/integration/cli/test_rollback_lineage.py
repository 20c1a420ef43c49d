"""Issue 47 item 3, after a rollback: prune and the keep policy retain the current lineage first, ``best`` moves to
the current lineage's best at once, and ``verify`` says what it checked.

A real ``model.fit`` of 10 epochs through :class:`~candle_ckpt.keras.callback.CandleCheckpointCallback` monitors a
metric ``score`` that a callback before it sets from a script (best overall: epoch 10; best of epochs 1-4: epoch
2), so where ``best`` must go is known. ``candle-ckpt`` runs as a subprocess (``python -m candle_ckpt``), then the
run resumes through ``restart()`` and the callback, whose own pruning after each commit is checked on disk.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before keras/tensorflow is imported

import shutil  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from test_cli import build_model, cli, epochs_on_disk, flip_byte  # noqa: E402

EPOCHS = 10
SCORES = {1: 5.0, 2: 2.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 7.0, 7: 8.0, 8: 9.0, 9: 1.5, 10: 1.0}
RESUMED = {5: 3.5, 6: 3.0}  # the resumed run's epochs 5 and 6: no better than epoch 2's 2.0


def _params(directory: Path, **overrides: Any) -> dict[str, Any]:
    params = {
        "epochs": EPOCHS,
        "ckpt_directory": str(directory),
        "ckpt_restart_mode": "auto",
        "ckpt_save_best_metric": "score",
        "ckpt_save_best_mode": "min",
        "ckpt_save_interval": 1,
    }
    return {**params, **overrides}


def _fit(directory: Path, scores: dict[int, float], epochs: int, **overrides: Any) -> dict[str, Any] | None:
    """restart() then fit to ``epochs`` with the checkpoint callback; ``score`` of completed epoch e is scores[e]."""
    import keras

    from candle_ckpt import CandleCheckpointCallback, restart

    class Score(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            logs["score"] = scores[epoch + 1]

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1))).astype("float32")
    model = build_model(seed=1)
    params = _params(directory, epochs=epochs, **overrides)
    info = restart(params, model, logger=None)
    start = info["epoch"] if info else 0
    ckpt = CandleCheckpointCallback(params, logger=None)
    model.fit(
        x, y, epochs=epochs, initial_epoch=start, batch_size=16, shuffle=False, verbose=0, callbacks=[Score(), ckpt]
    )
    keras.backend.clear_session()
    return info


@pytest.fixture(scope="module")
def ten(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job trained 10 epochs from scratch, every epoch saved, best -> 010 (the lowest score)."""
    directory = tmp_path_factory.mktemp("lineage") / "save"
    _fit(directory, SCORES, EPOCHS)
    return directory


def _links(d: Path) -> tuple[str, str]:
    return os.readlink(d / "ckpts" / "best"), os.readlink(d / "ckpts" / "last")


def _rolled_back(ten: Path, tmp_path: Path, epoch: int = 4) -> tuple[Path, list[str]]:
    d = tmp_path / "save"
    shutil.copytree(ten, d, symlinks=True)
    assert _links(d) == ("epochs/010", "epochs/010")
    proc = cli("rollback", d, epoch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return d, proc.stdout.splitlines()


def test_rollback_moves_best_at_once_to_the_best_of_the_current_lineage(ten: Path, tmp_path: Path) -> None:
    """`rollback DIR 4` points last at epochs/004 and best, at once, at epochs/002 (the lowest score of epochs 1-4,
    not the abandoned epoch 10); it says so, logs it, and deletes nothing."""
    d, out = _rolled_back(ten, tmp_path)
    assert _links(d) == ("epochs/002", "epochs/004")
    assert out == [
        "last -> epochs/004 (was epochs/010); checkpoint verified",
        "best -> epochs/002 (was epochs/010): the lowest score of the current lineage (epochs 1-4)",
        "the next restart() resumes after epoch 4",
    ]
    log = (d / "ckpt.log").read_text()
    assert "rollback: best -> epochs/002 (was epochs/010): the lowest score" in log
    assert epochs_on_disk(d) == list(range(1, EPOCHS + 1))


def test_after_a_rollback_prune_keeps_the_current_lineage_newest(ten: Path, tmp_path: Path) -> None:
    """After `rollback DIR 4`, `prune --keep-limit 2 --dry-run` keeps epochs 3 and 4 (the current lineage's newest)
    and best (2), not the abandoned 9 and 10, and says why; the real prune removes exactly what it listed."""
    d, _ = _rolled_back(ten, tmp_path)
    proc = cli("prune", d, "--keep-limit", "2", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1] == "the current lineage first: 6 checkpoints (5-10) of a lineage a rollback abandoned rank below it"
    kept = [line.split()[1] for line in lines if line.startswith("keep ")]
    gone = [line.split()[2] for line in lines if line.startswith("would remove")]
    assert kept == ["epochs/002", "epochs/003", "epochs/004"], proc.stdout
    assert gone == ["epochs/001", *(f"epochs/{e:03d}" for e in range(5, 11))], proc.stdout
    assert "dry run: would remove 7 of 10 checkpoints" in proc.stdout
    assert epochs_on_disk(d) == list(range(1, EPOCHS + 1))
    assert cli("prune", d, "--keep-limit", "2").returncode == 0
    assert epochs_on_disk(d) == [2, 3, 4] and _links(d) == ("epochs/002", "epochs/004")


def test_after_a_rollback_verify_checks_every_checkpoint_and_names_the_abandoned(ten: Path, tmp_path: Path) -> None:
    """`verify` after a rollback checks all 10 checkpoints on disk, marks 5-10 as abandoned and says so under them;
    a damaged abandoned checkpoint fails it (exit 1), named as abandoned."""
    d, _ = _rolled_back(ten, tmp_path)
    proc = cli("verify", d)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    marked = [int(line.split()[1].rstrip(":")) for line in lines[:EPOCHS] if line.endswith("(abandoned by a rollback)")]
    assert [line.split()[1] for line in lines[:EPOCHS]] == [f"{e:03d}:" for e in range(1, EPOCHS + 1)]
    assert marked == [5, 6, 7, 8, 9, 10] and all(": ok  " in line for line in lines[:EPOCHS])
    assert lines[EPOCHS:] == [
        "6 checkpoints (5-10) of a lineage a rollback abandoned were checked too: not on the way to last, never "
        f"restored; candle-ckpt prune {d} --abandoned removes them",
        "all 10 checkpoints verified",
    ]
    flip_byte(d / "ckpts" / "epochs" / "007" / "model.keras")
    proc = cli("verify", d)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (bad,) = [line for line in proc.stdout.splitlines() if "FAILED  " in line]
    assert bad.startswith("epoch 007: FAILED") and bad.endswith("(abandoned by a rollback)"), bad
    assert "1 of 10 checkpoints FAILED verification" in proc.stdout


def test_the_resumed_runs_own_pruning_retains_its_lineage(ten: Path, tmp_path: Path) -> None:
    """After `rollback DIR 4`, the resumed run (ckpt_keep_limit 3, epochs 5-6 no better than epoch 2) prunes after
    each commit as the keep rule says for its lineage: epochs 2 (best), 4, 5, 6 stay; the abandoned 7-10 are gone
    (before this fix its newest three were the abandoned 8-10)."""
    d, _ = _rolled_back(ten, tmp_path)
    info = _fit(d, RESUMED, 6, ckpt_keep_limit=3)
    assert info is not None and info["epoch"] == 4
    assert epochs_on_disk(d) == [2, 4, 5, 6]
    assert _links(d) == ("epochs/002", "epochs/006")
    assert "abandoned" not in cli("list", d).stdout
