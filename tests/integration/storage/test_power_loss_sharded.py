"""Power loss at every step of a multi-part commit: two ranks (threads) write through one recorder.

After every recorded operation of either rank, the harness rebuilds what a
power cut would leave (see :mod:`candle_ckpt.testing.crashsim`), writes each
distinct state to a real directory and checks what a restart would see: the
newest valid checkpoint is the previous one or the new one, every file of it
passes its size and CRC check, and its arrays are exactly that epoch's, never
a mix; once the primary's commit returned, the new one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shardkit import save_sharded, state_for

from candle_ckpt.storage.reader import CheckpointReader
from candle_ckpt.storage.shardread import ShardedReader
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.crashsim import RecordingFS, RecordingNoSymlinkFS, materialize, state_digest
from candle_ckpt.testing.groups import ThreadGroup


def record(root: Path, fs: RecordingFS, before: int, recorded: int) -> None:
    """Commit ``before`` epochs unrecorded, then ``recorded`` more (each followed by a prune) while recording."""
    store = CheckpointStore(root, fs=fs)
    if before == 0:
        fs.start()  # the very first save also creates ckpts/ and epochs/
    store.open_for_write()
    real_commit = store.commit

    def commit(epoch, *args, **kwargs):
        side = real_commit(epoch, *args, **kwargs)
        fs.mark(f"committed {epoch}")
        return side

    store.commit = commit
    for epoch in range(1, before + recorded + 1):
        if epoch == before + 1 and before:
            fs.start()
        results = save_sharded(str(root), ThreadGroup(2), epoch, store=store, fs_for=lambda rank: fs)
        assert results[1] == f"epochs/{epoch:03d}", results
        store.prune(lambda epochs, protected: set())  # keeps best and last only
    fs.stop()
    store.close()


def check_states(tmp_path: Path, fs: RecordingFS, floor0: int) -> dict[int, int]:
    """Check every distinct crash state; return how many resumed from each epoch."""
    distinct: dict[str, tuple[dict, int, str]] = {}
    for point, state in fs.crash_states():
        floor = max([floor0, *(int(m.split()[1]) for m in point.marks)])
        key = state_digest(state)
        if key not in distinct or floor > distinct[key][1]:
            distinct[key] = (state, floor, f"after op {point.index} ({point.op}), {point.variant}")
    resumed: dict[int, int] = {}
    for i, (state, floor, where) in enumerate(distinct.values()):
        d = tmp_path / f"state{i}"
        materialize(state, d)
        reader = CheckpointReader(d)
        for epoch in reader.epochs():  # no partial epochs/NNN is ever visible
            reader.verify(epoch)
        found = reader.find_valid()
        epoch = found[0] if found else 0
        assert epoch >= floor, f"crash {where}: restart sees epoch {epoch}, but epoch {floor} had been committed"
        if found:
            with ShardedReader(reader.layout.epoch_dir(epoch)) as shards:
                for path, array in state_for(epoch).items():
                    assert shards.read(path).tobytes() == array.tobytes(), f"crash {where}: {path}"
        resumed[epoch] = resumed.get(epoch, 0) + 1
    return resumed


@pytest.mark.parametrize(
    ("before", "recorded", "fs_class"),
    [(0, 2, RecordingFS), (1, 1, RecordingFS), (1, 1, RecordingNoSymlinkFS)],
    ids=["fresh-directory", "append-and-prune", "no-symlinks"],
)
def test_every_cut_leaves_the_previous_or_the_new_sharded_checkpoint(
    tmp_path: Path, before: int, recorded: int, fs_class: type
) -> None:
    """At every power-cut point of a two-rank commit, restart finds the previous or the new epoch, whole."""
    root = tmp_path / "job"
    root.mkdir()
    fs = fs_class(root, seed=7)
    record(root, fs, before, recorded)
    ops = "\n".join(fs.ops)
    for step in ("create ckpts/work/part-00001.bin", "create ckpts/work/manifest.json", "ckpts/work -> "):
        assert step in ops, f"{step!r} was not recorded"
    resumed = check_states(tmp_path / "states", fs, before)
    final = before + recorded
    assert resumed.get(final), f"no crash state resumed the last commit: {resumed}"
    assert set(resumed) <= set(range(final + 1)), resumed
    assert len(resumed) >= 2, f"every state resumed the same epoch: {resumed}"
