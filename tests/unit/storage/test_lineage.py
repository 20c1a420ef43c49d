"""After a rollback: the store retains the current lineage first, and ``best`` follows the lineage (issue 47).

Real stores in ``tmp_path``, committed with small files; what a rollback and a prune leave is read back from the
disk (the epochs, the link targets). The same flows through ``model.fit`` and the CLI:
tests/integration/cli/test_rollback_lineage.py.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.retention import KeepExponential, KeepLatest
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.lineage import abandoned_epochs
from candle_ckpt.storage.store import CheckpointStore

_TEMPLATE = Sidecar(epoch=0, generation=0, model_file="model.bin", files={}, save_best_metric="score")
SCORES = {1: 5.0, 2: 2.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 7.0, 7: 8.0, 8: 9.0, 9: 1.5, 10: 1.0}  # best: 10; of 1-4: 2


def _commit(store: CheckpointStore, epoch: int, best: int | None, resumed_from: int | None = None, **logs) -> None:
    """Commit ``epoch`` as the callback would: ``best`` is where best tracking says the best is."""
    side = replace(_TEMPLATE, save_best_mode="min", logs=logs, resumed_from=resumed_from)
    files = [FileSpec("model.bin", lambda f, e=epoch: f.write(b"w%d" % e))]
    store.commit(epoch, files, side, best_epoch=best)


def _ten_epochs(tmp_path: Path, *, score: bool = True) -> CheckpointStore:
    """A run from scratch of 10 epochs that logs ``score`` (SCORES) or nothing."""
    store = CheckpointStore(tmp_path / "save")
    store.open_for_write()
    for epoch in range(1, 11):
        best = min(range(1, epoch + 1), key=SCORES.__getitem__) if score else None
        _commit(store, epoch, best, **({"score": SCORES[epoch]} if score else {}))
    return store


def _link(store: CheckpointStore, name: str) -> str | None:
    path = store.layout.link(name)
    return os.readlink(path) if os.path.lexists(path) else None


def test_rollback_moves_best_at_once_to_the_best_of_the_current_lineage(tmp_path: Path) -> None:
    """rollback(4) of a run whose best is epoch 10 points last at 4 and best at 2 (the lowest score of 1-4), at once;
    the later epochs stay on disk as the abandoned lineage."""
    store = _ten_epochs(tmp_path)
    assert _link(store, "best") == "epochs/010"
    done = store.rollback(4)
    assert (_link(store, "last"), _link(store, "best")) == ("epochs/004", "epochs/002")
    assert (done.last_before, done.best_before, done.best.epoch, done.best.metric) == (10, 10, 2, "score")
    assert done.best.lineage == [1, 2, 3, 4] and store.epochs() == list(range(1, 11))
    assert abandoned_epochs(store, 4) == [5, 6, 7, 8, 9, 10]


def test_rollback_removes_best_when_no_checkpoint_of_the_lineage_records_the_metric(tmp_path: Path) -> None:
    """Where no checkpoint of the lineage holds a value of the monitored metric, best (which named a checkpoint of
    the abandoned run) is removed; without a best link, rollback makes none."""
    store = _ten_epochs(tmp_path, score=False)
    store.set_link("best", 9)  # as a run that monitored the metric later would have left it
    done = store.rollback(4)
    assert _link(store, "best") is None and done.had_best and done.best.epoch is None
    again = store.rollback(3)
    assert _link(store, "best") is None and not again.had_best and _link(store, "last") == "epochs/003"


def test_rollback_needs_the_writer_lock_and_refuses_a_damaged_checkpoint(tmp_path: Path) -> None:
    """rollback() refuses a store not open for writing, and a checkpoint that fails verification changes nothing."""
    store = _ten_epochs(tmp_path)
    (Path(store.layout.epoch_dir(3)) / "model.bin").write_bytes(b"XX")
    with pytest.raises(CheckpointError, match="model.bin"):
        store.rollback(3)
    assert (_link(store, "last"), _link(store, "best")) == ("epochs/010", "epochs/010")
    store.close()
    with pytest.raises(CheckpointError, match=r"open_for_write\(\) must be called before rollback"):
        store.rollback(4)


@pytest.mark.parametrize(
    ("policy", "keep"),
    [(KeepLatest(2), [2, 3, 4]), (KeepExponential(3), [2, 3, 4]), (KeepLatest(6), [1, 2, 3, 4, 9, 10])],
)
def test_after_a_rollback_prune_keeps_the_current_lineage_first(tmp_path: Path, policy, keep: list[int]) -> None:
    """After rollback(4), the keep rule fills its limit from the current lineage (1-4, newest first) before any
    checkpoint the rollback abandoned (5-10, kept only where room is left); best (2) and last (4) are kept."""
    store = _ten_epochs(tmp_path)
    store.rollback(4)
    plan = store.prune_plan(policy.select)
    assert plan == (keep, sorted(set(range(1, 11)) - set(keep)))
    assert store.prune(policy.select) == plan[1] and store.epochs() == keep


def test_the_keep_rule_after_each_commit_of_the_resumed_run_retains_its_lineage(tmp_path: Path) -> None:
    """The resumed run's own commits (epochs 5 and 6, resumed from 4) then a prune as the callback makes one after
    each commit: its lineage's newest stay, the abandoned run's 7-10 go; a prune with lineage_first=False (a rule
    about the lineage itself) sees the epochs as they are."""
    store = _ten_epochs(tmp_path)
    store.rollback(4)
    _commit(store, 5, 2, resumed_from=4, score=3.5)
    assert store.prune_plan(KeepLatest(3).select, lineage_first=False)[0] == [2, 5, 8, 9, 10]
    _commit(store, 6, 2, resumed_from=4, score=3.0)
    assert store.prune(KeepLatest(3).select, protected=[4]) == [1, 3, 7, 8, 9, 10]
    assert store.epochs() == [2, 4, 5, 6] and _link(store, "last") == "epochs/006"
