"""The one restore protocol of every multi-process job (``engine/group_restore.py``), ranks as threads of a
ThreadGroup: a rank that cannot verify its files makes every rank fall back together; a directory of each rank's
own is refused where only the primary commits (``node_local=False``: tf.distribute); a rank that never comes is
named, within the bound given."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from shardkit import run_ranks, save_sharded

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import GroupTimeout, NoValidCheckpoint
from candle_ckpt.core.group import Group
from candle_ckpt.core.log import OpsLog
from candle_ckpt.engine.group_restore import agree_on_checkpoint
from candle_ckpt.engine.restore import restore
from candle_ckpt.engine.watchdog import HANG_EXIT, Watchdog
from candle_ckpt.storage.reader import CheckpointReader
from candle_ckpt.storage.sharded import MANIFEST
from candle_ckpt.testing.groups import ThreadGroup

LOGGER = "candle_ckpt.test_group_restore"


def _needed(rank: int):
    """The files of a sharded checkpoint rank ``rank`` reads: the manifest and its own part and state."""

    def needed(where: str) -> set[str]:
        return {MANIFEST} | {n for n in os.listdir(where) if f"{rank:05d}" in n}

    return needed


def _kept(rank: int):
    """keep(names): the rank's own part, as ``multihost.load.kept_parts`` gives it when the counts match."""
    return lambda names: {f"part-{rank:05d}.bin"} & set(names)


def _restore(
    dirs: list[Path], *, node_local: bool = True, mode: str = "auto", keep: bool = False, contents: bool = False
) -> list[Any]:
    """Every rank's ``agree_on_checkpoint`` (rank r in ``dirs[r]``): the epoch agreed (with ``contents``: and
    what the verification returned), None, or the exception."""

    def work(g: Group) -> Any:
        cfg = CkptConfig.from_params({"ckpt_directory": str(dirs[g.rank]), "ckpt_restart_mode": mode})
        log = OpsLog(None, logging.getLogger(LOGGER))
        chosen = agree_on_checkpoint(cfg, log, g, "restore/0", (), _needed(g.rank), mapped=False, timeout_s=30,
                                     node_local=node_local, keep=_kept(g.rank) if keep else None)  # fmt: skip
        if chosen is None:
            return None
        return (chosen.epoch, chosen.contents) if contents else chosen.epoch

    return run_ranks(ThreadGroup(len(dirs)), work)


@pytest.mark.parametrize("keep", [False, True], ids=["checked", "kept"])
def test_a_rank_whose_part_fails_its_crc_makes_every_rank_fall_back(tmp_path: Path, caplog, keep: bool) -> None:
    """Epoch 2's part of rank 1 has a flipped byte (same size): the primary checks only its size and chooses
    epoch 2, rank 1's CRC check fails, and both ranks agree on epoch 1; the primary's log says why. ``kept``:
    each rank reads its part whole (rank 1 reads ahead the part of ``last``, the damaged one): the same."""
    hub = ThreadGroup(2)
    for epoch in (1, 2):
        assert not any(isinstance(r, BaseException) for r in save_sharded(str(tmp_path), hub, epoch))
    part = Path(CheckpointReader(tmp_path).layout.epoch_dir(2), "part-00001.bin")
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with caplog.at_level("INFO", logger=LOGGER):
        assert _restore([tmp_path, tmp_path], keep=keep) == [1, 1]
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("restart: process 1: ") and "part-00001.bin" in m for m in said), said
    assert any(m.startswith("restart: skipping epoch 2: ") and "process 1: " in m for m in said), said


def test_every_rank_gets_its_own_part_back_whole_and_checked(tmp_path: Path) -> None:
    """keep: every rank's verification returns its own part of the chosen checkpoint (the newest) as bytes,
    equal to the file (rank 1's read ahead while the primary chose), and nothing of the other rank's."""
    hub = ThreadGroup(2)
    for epoch in (1, 2):
        assert not any(isinstance(r, BaseException) for r in save_sharded(str(tmp_path), hub, epoch))
    where = Path(CheckpointReader(tmp_path).layout.epoch_dir(2))
    results = _restore([tmp_path, tmp_path], keep=True, contents=True)
    for rank, (epoch, contents) in enumerate(results):
        assert epoch == 2
        parts = {name for name in contents if name.endswith(".bin")}
        assert parts == {f"part-{rank:05d}.bin"}
        assert contents[f"part-{rank:05d}.bin"] == (where / f"part-{rank:05d}.bin").read_bytes()


def test_own_directories_are_refused_where_only_the_primary_commits(tmp_path: Path) -> None:
    """node_local=False (tf.distribute): the primary's directory holds a checkpoint, the other rank's is its own
    and empty: every rank raises NoValidCheckpoint naming the fix (the others could not read the checkpoint)."""
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    assert not any(isinstance(r, BaseException) for r in save_sharded(str(dirs[0]), ThreadGroup(1), 1))
    results = _restore(dirs, node_local=False)
    assert all(isinstance(r, NoValidCheckpoint) for r in results), results
    for r in results:
        assert "is not shared" in str(r) and "one ckpt_directory on a file system they all share" in str(r)


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_own_empty_directories_start_from_scratch_or_raise_as_the_mode_says(tmp_path: Path, mode: str) -> None:
    """node_local=False with nothing to restore anywhere: every rank starts from scratch (auto), or raises
    NoValidCheckpoint (required), as a one-process restart would."""
    results = _restore([tmp_path / "node0", tmp_path / "node1"], node_local=False, mode=mode)
    if mode == "auto":
        assert results == [None, None]
    else:
        assert all(isinstance(r, NoValidCheckpoint) for r in results), results


def test_a_rank_that_never_comes_is_named_within_the_bound_given(tmp_path: Path) -> None:
    """Rank 1 of 2 never restores: the primary raises GroupTimeout at the first meeting point, naming it and
    rank 1, after timeout_s (not the default group bound)."""
    primary = ThreadGroup(2).members[0]
    cfg = CkptConfig.from_params({"ckpt_directory": str(tmp_path)})
    log = OpsLog(None, logging.getLogger(LOGGER))
    with pytest.raises(GroupTimeout, match=r"'restore/0/tiers' within 0.2 s \(rank\(s\) 1 never came\)"):
        agree_on_checkpoint(cfg, log, primary, "restore/0", (), None, timeout_s=0.2)


class _NoLoad:
    """An adapter with nothing to read (a rank that never comes makes the restore time out before any load)."""

    reads = ()

    def restore(self, chosen: Any, log: OpsLog, where: str) -> None:
        raise AssertionError("nothing is loaded when a rank never comes")


@pytest.mark.parametrize("exits", [False, True], ids=["raises", "hang"])
def test_a_meeting_that_times_out_is_a_hang_only_where_the_front_end_asks(tmp_path: Path, monkeypatch, exits) -> None:
    """restore() of a group whose rank 1 never comes: GroupTimeout for WorkerTrainingState's callers; with
    timeout_exits (restart()'s and JobRunner's), the watchdog's report, naming the bound, the meeting point and
    rank 1, ends the process instead (its exit replaced here), after ``prepare`` ran under the watch."""
    fired: list[tuple[float, str, str]] = []

    def fire(dog: Watchdog, idle: float, limit: float, how: str | None = None) -> None:
        fired.append((limit, how or "", dog.now()))
        raise SystemExit(HANG_EXIT)

    monkeypatch.setattr(Watchdog, "fire", fire)
    monkeypatch.setenv("CANDLE_CKPT_GROUP_TIMEOUT_S", "0.2")
    cfg = CkptConfig.from_params({"ckpt_directory": str(tmp_path)})
    log = OpsLog(None, logging.getLogger(LOGGER))
    prepared: list[str] = []
    kwargs = {"group": ThreadGroup(2).members[0], "timeout_s": 0.2, "timeout_exits": exits}
    if not exits:
        with pytest.raises(GroupTimeout, match=r"rank\(s\) 1 never came"):
            restore(cfg, log, _NoLoad(), **kwargs)
        assert fired == []
        return
    with pytest.raises(SystemExit) as ended:
        restore(cfg, log, _NoLoad(), prepare=lambda: prepared.append("prepared"), **kwargs)
    assert ended.value.code == HANG_EXIT and prepared == ["prepared"]
    ((limit, how, phase),) = fired
    assert (limit, phase) == (0.2, "restore"), fired
    assert how.startswith("CANDLE_CKPT_GROUP_TIMEOUT_S: ") and "'restore/0/tiers'" in how and "rank(s) 1" in how
