"""The multi-part commit: ranks (threads of a ThreadGroup) write parts, the primary alone publishes.

Asserted on disk: the published directory, its sidecar listing every file, the
arrays read back, and, when a rank fails or never comes, that nothing was
published and the previous checkpoint is still the one ``last`` names.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from shardkit import rank_part, run_ranks, save_sharded, sidecar_template, state_for

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, CheckpointSaveError, CorruptCheckpoint, GroupTimeout
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.storage.filecheck import Prefetch
from candle_ckpt.storage.multipart import SharedSave, write_rank_part
from candle_ckpt.storage.reader import CheckpointReader
from candle_ckpt.storage.sharded import MANIFEST
from candle_ckpt.storage.shardread import ShardedReader
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.faultfs import FaultFS
from candle_ckpt.testing.groups import ThreadGroup


def assert_holds(directory: Path, epoch: int) -> None:
    """``epochs/NNN`` verifies (every file's size and CRC) and holds exactly state_for(epoch)."""
    reader = CheckpointReader(directory)
    reader.verify(epoch)
    with ShardedReader(reader.layout.epoch_dir(epoch)) as shards:
        for path, array in state_for(epoch).items():
            assert shards.read(path).tobytes() == array.tobytes(), path


def test_two_ranks_commit_one_checkpoint_listing_every_file(tmp_path: Path) -> None:
    """Both ranks return the published name; the sidecar lists both parts, both train states, config and manifest."""
    hub = ThreadGroup(2)
    for epoch in (1, 2):
        results = save_sharded(str(tmp_path), hub, epoch)
        assert results[1] == f"epochs/{epoch:03d}", results
        assert results[0].epoch == epoch
    reader = CheckpointReader(tmp_path)
    assert reader.epochs() == [1, 2] and reader.link_epoch("last") == 2 and reader.link_epoch("best") == 2
    side = reader.read_sidecar(2)
    assert side.model_file == MANIFEST
    expected = {"config.json", MANIFEST, "part-00000.bin", "part-00000.json", "part-00001.bin", "part-00001.json"}
    expected |= {"train.state.p00000.npz", "train.state.p00001.npz"}
    assert set(side.files) == expected
    assert set(os.listdir(reader.layout.epoch_dir(2))) == expected | {L.SIDECAR}
    assert_holds(tmp_path, 1)
    assert_holds(tmp_path, 2)
    assert not os.path.exists(reader.layout.work)


def test_three_ranks_and_a_step_checkpoint(tmp_path: Path) -> None:
    """Three ranks commit an epoch, then a step checkpoint into steps/GGG; each reads back exactly."""
    hub = ThreadGroup(3)
    assert save_sharded(str(tmp_path), hub, 1)[2] == "epochs/001"
    results = save_sharded(str(tmp_path), ThreadGroup(3), 1, step=5)
    assert results[1] == results[2] and results[1].startswith("steps/")
    store = CheckpointStore(tmp_path)
    (generation,) = store.steps.generations()
    side, _ = store.steps.verify(generation)
    assert side.step == 5 and "part-00002.bin" in side.files
    with ShardedReader(store.layout.step_dir(generation)) as shards:
        assert shards.read("dense/kernel").tobytes() == state_for(1)["dense/kernel"].tobytes()


@pytest.mark.parametrize("op", ["create", "write", "fsync"])
def test_a_rank_that_fails_its_part_publishes_nothing(tmp_path: Path, op: str) -> None:
    """An EIO on rank 1 (at its first create, write or fsync) fails the save on both ranks; epoch 1 stays last."""
    hub = ThreadGroup(2)
    save_sharded(str(tmp_path), hub, 1)
    faulty = FaultFS(fail_at=1, kinds=[op])
    results = save_sharded(str(tmp_path), ThreadGroup(2), 2, fs_for=lambda rank: faulty if rank == 1 else LocalFS())
    assert faulty.failed is not None
    assert isinstance(results[0], CheckpointSaveError) and "could not write its part" in str(results[0])
    assert isinstance(results[1], CheckpointSaveError) and "rank 1 could not write its part" in str(results[1])
    reader = CheckpointReader(tmp_path)
    assert reader.epochs() == [1] and reader.link_epoch("last") == 1
    assert not os.path.exists(reader.layout.work)
    assert_holds(tmp_path, 1)


def test_a_part_damaged_after_its_write_is_caught_by_the_reader_naming_it(tmp_path: Path) -> None:
    """A bit flipped in rank 1's .bin after its fsync: the save trusts the CRC32 rank 1 computed while writing (it
    does not re-read the data), so the checkpoint's sidecar holds the true CRC and the reader's check names
    part-00001.bin; choosing a checkpoint falls back to epoch 1."""

    class Flip(LocalFS):
        def fsync(self, fd: int, path: str) -> None:
            super().fsync(fd, path)
            if path.endswith("part-00001.bin"):
                os.pwrite(fd, bytes([os.pread(fd, 1, 0)[0] ^ 1]), 0)

    save_sharded(str(tmp_path), ThreadGroup(2), 1)
    results = save_sharded(str(tmp_path), ThreadGroup(2), 2, fs_for=lambda rank: Flip())
    assert results[1] == "epochs/002", results
    reader = CheckpointReader(tmp_path)
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: CRC32 is"):
        reader.verify(2)
    problems: list[str] = []
    found = reader.find_valid(on_problem=lambda epoch, why: problems.append(f"{epoch}: {why}"))
    assert found is not None and found[0] == 1
    assert len(problems) == 1 and problems[0].startswith("2: ") and "part-00001.bin" in problems[0]


def test_a_rank_that_never_comes_times_out_and_nothing_is_published(tmp_path: Path) -> None:
    """Rank 1 dead before the save: the primary raises GroupTimeout naming the meeting point and rank 1."""
    save_sharded(str(tmp_path), ThreadGroup(2), 1)
    store = CheckpointStore(tmp_path)
    store.open_for_write()

    hub = ThreadGroup(2)
    shared = SharedSave(hub.members[0], "save/2", rank_part(state_for(2), 0, 2), timeout_s=0.3)
    with pytest.raises(GroupTimeout, match=r"'save/2/parts-written' within 0.3 s \(rank\(s\) 1 never came\)"):
        store.commit(2, [], sidecar_template(), shared=shared)
    store.close()
    reader = CheckpointReader(tmp_path)
    assert reader.epochs() == [1] and reader.link_epoch("last") == 1
    assert not os.path.exists(reader.layout.work)


def test_when_the_primary_cannot_start_the_others_hear_it(tmp_path: Path) -> None:
    """A primary whose store is not open for writing fails the save, and rank 1 is told, not left waiting."""
    store = CheckpointStore(tmp_path)

    def work(g):
        part = rank_part(state_for(1), g.rank, 2)
        if g.rank == 0:
            return store.commit(1, [], sidecar_template(), shared=SharedSave(g, "k", part, timeout_s=30))
        return write_rank_part(store.layout, g, "k", part, timeout_s=30)

    results = run_ranks(ThreadGroup(2), work)
    assert isinstance(results[0], CheckpointError) and "open_for_write() must be called" in str(results[0])
    assert isinstance(results[1], CheckpointSaveError) and "the primary could not start the save" in str(results[1])
    assert not os.path.exists(CheckpointReader(tmp_path).layout.work)


def test_a_part_given_as_a_callable_that_raises_fails_the_save_everywhere(tmp_path: Path) -> None:
    """Rank 1's part is a callable (its snapshot failed): both ranks raise, naming it; epoch 1 stays last."""
    save_sharded(str(tmp_path), ThreadGroup(2), 1)
    store = CheckpointStore(tmp_path)
    store.open_for_write()

    def broken(work: str) -> None:
        raise RuntimeError("snapshot of rank 1 failed")

    def work(g):
        if g.rank == 0:
            shared = SharedSave(g, "s2", rank_part(state_for(2), 0, 2), timeout_s=30)
            return store.commit(2, [], sidecar_template(), shared=shared)
        return write_rank_part(store.layout, g, "s2", broken, timeout_s=30)

    results = run_ranks(ThreadGroup(2), work)
    store.close()
    assert isinstance(results[0], CheckpointSaveError) and "could not write its part" in str(results[0])
    assert isinstance(results[1], CheckpointSaveError) and "snapshot of rank 1 failed" in str(results[1])
    reader = CheckpointReader(tmp_path)
    assert reader.epochs() == [1] and reader.link_epoch("last") == 1


def test_restart_choice_falls_back_past_a_damaged_part(tmp_path: Path) -> None:
    """A flipped byte in the newest checkpoint's part-00001.bin: find_valid names it and picks the previous epoch."""
    for epoch in (1, 2):
        save_sharded(str(tmp_path), ThreadGroup(2), epoch)
    reader = CheckpointReader(tmp_path)
    part = Path(reader.layout.epoch_dir(2)) / "part-00001.bin"
    raw = bytearray(part.read_bytes())
    raw[-1] ^= 0x01
    part.write_bytes(bytes(raw))
    problems: list[tuple[int, str]] = []
    epoch, side, _ = reader.find_valid(on_problem=lambda e, why: problems.append((e, why)))
    assert epoch == 1 and side.model_file == MANIFEST
    assert problems and problems[0][0] == 2 and "part-00001.bin: CRC32 is" in problems[0][1]
    assert_holds(tmp_path, 1)


def test_a_rank_verifies_only_the_files_it_reads(tmp_path: Path) -> None:
    """verify(only=) checks just the named files: rank 0's part passes while rank 1's is damaged; a stray name fails."""
    save_sharded(str(tmp_path), ThreadGroup(2), 1)
    reader = CheckpointReader(tmp_path)
    part = Path(reader.layout.epoch_dir(1)) / "part-00001.bin"
    part.write_bytes(b"\0" + part.read_bytes()[1:])
    mine = {MANIFEST, "part-00000.bin", "train.state.p00000.npz"}
    side, contents = reader.verify(1, only=mine, reads=["train.state.p00000.npz"])
    assert contents["train.state.p00000.npz"] == b"rank 0 state"
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: CRC32"):
        reader.verify(1, only={"part-00001.bin"})
    with pytest.raises(CorruptCheckpoint, match="has no part-00009.bin"):
        reader.verify(1, only={"part-00009.bin"})


def test_crc_scope_checks_the_crc_of_the_files_named_and_the_size_of_the_others(tmp_path: Path) -> None:
    """With crc_scope, a flipped byte in a part outside the scope passes, a truncated one does not; a scope that
    raises rejects the checkpoint and the choice falls back to the one before, saying why."""
    for epoch in (1, 2):
        save_sharded(str(tmp_path), ThreadGroup(2), epoch)
    reader = CheckpointReader(tmp_path)
    part = Path(reader.layout.epoch_dir(2)) / "part-00001.bin"
    raw = bytearray(part.read_bytes())
    raw[0] ^= 0xFF
    part.write_bytes(bytes(raw))
    reader.crc_scope = lambda directory, side: {"part-00000.bin", "part-00000.json", MANIFEST}
    reader.verify(2)  # part 1 is not read by this process: its size is checked, not its CRC
    reader.crc_scope = None
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: CRC32 is"):
        reader.verify(2)
    part.write_bytes(bytes(raw[:-1]))
    reader.crc_scope = lambda directory, side: {MANIFEST}
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: size is"):
        reader.verify(2)
    rejected = reader.layout.epoch_dir(2)

    def scope(directory: str, side) -> None:
        if directory == rejected:
            raise CorruptCheckpoint(directory, "process 1: its part is damaged")

    reader.crc_scope = scope
    problems: list[str] = []
    found = reader.find_valid(on_problem=lambda epoch, why: problems.append(f"{epoch}: {why}"))
    assert found is not None and found[0] == 1
    assert problems == [f"2: {rejected}: process 1: its part is damaged"]


def test_keep_scope_returns_the_kept_part_as_bytes_checked_and_a_read_ahead_is_used_only_if_unchanged(
    tmp_path: Path,
) -> None:
    """keep_scope: the kept part comes back as bytes (even with mapped=True), equal to the file and CRC-checked
    (a flipped byte in it is caught); bytes read ahead (Prefetch) are used while the file is the one read, and
    after the file is replaced by another of the same size they are not: the new file is read and checked."""
    save_sharded(str(tmp_path), ThreadGroup(2), 1)
    reader = CheckpointReader(tmp_path)
    part = Path(reader.layout.epoch_dir(1)) / "part-00001.bin"
    original = part.read_bytes()
    reader.keep_scope = lambda directory, side: {"part-00001.bin"}
    _, contents = reader.verify(1, reads=("train.state.p00001.npz",), mapped=True)
    assert type(contents["part-00001.bin"]) is bytes and contents["part-00001.bin"] == original
    assert set(contents) == {"part-00001.bin", "train.state.p00001.npz"}

    with Prefetch([str(part)]) as ahead:
        reader.prefetched = ahead
        _, contents = reader.verify(1)
        assert contents["part-00001.bin"] == original
        assert ahead.take(str(part)) is None  # taken once: the verification took it

    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF
    with Prefetch([str(part)]) as ahead:
        assert ahead.take(str(part)) == original  # (this test takes it; read ahead again for the verification)
    with Prefetch([str(part)]) as ahead:
        ahead.take(str(tmp_path / "nothing"))  # waits for the read ahead to end
        staged = part.with_name("staged")
        staged.write_bytes(bytes(damaged))
        os.replace(staged, part)  # another file, same name and size: the bytes read ahead are not used
        reader.prefetched = ahead
        with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: CRC32 is"):
            reader.verify(1)
    reader.prefetched = None
    part.write_bytes(bytes(damaged))
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: CRC32 is"):
        reader.verify(1)
