"""The sharded format: parts written by several ranks, a manifest, and reads of any slice.

Random global shapes and random chunkings (hypothesis): whatever the chunking, a
read of any slice equals numpy's slicing of the original array; a damaged part
is caught and named.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from candle_ckpt.core.errors import CorruptCheckpoint, GroupTimeout
from candle_ckpt.core.group import SOLO
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.manifest import write_manifest
from candle_ckpt.storage.sharded import MANIFEST, Chunk, part_bin, part_index, write_part
from candle_ckpt.storage.shardread import ShardedReader, consolidate
from candle_ckpt.testing.groups import ThreadGroup


def split_points(draw, n: int, pieces: int) -> list[int]:
    """Sorted cut points 0 = c0 <= ... <= ck = n splitting one dimension into up to ``pieces`` pieces."""
    cuts = draw(st.lists(st.integers(0, n), max_size=pieces - 1))
    return [0, *sorted(cuts), n]


@st.composite
def chunked_array(draw):
    """A random array with a random grid chunking, each block owned by a random rank."""
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from(["float32", "int64", "uint8", "float16", "bool", "bfloat16"]))
    ranks = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype == "bfloat16":
        import ml_dtypes

        array = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    else:
        array = (rng.standard_normal(shape) * 100).astype(dtype)
    grids = [split_points(draw, n, 3) for n in shape]
    blocks = [()]
    for cuts in grids:
        pieces = [(s, e) for s, e in zip(cuts, cuts[1:], strict=False) if s < e] or [
            (0, cuts[-1])
        ]  # a 0-long dim: one piece
        blocks = [(*b, piece) for b in blocks for piece in pieces]
    owners = [draw(st.integers(0, ranks - 1)) for _ in blocks]
    return np.asarray(array), blocks, owners, ranks


@st.composite
def any_slice(draw, shape):
    out = []
    for n in shape:
        start = draw(st.integers(0, n))
        out.append(slice(start, draw(st.integers(start, n))))
    return tuple(out)


def write_all(work: Path, arrays: dict[str, tuple[np.ndarray, list, list]], ranks: int) -> None:
    """Every rank writes the blocks it owns, then the primary writes the manifest."""
    for rank in range(ranks):
        chunks = [
            Chunk(path, str(a.dtype), a.shape, block, np.array(a[tuple(slice(s, e) for s, e in block)], order="C"))
            for path, (a, blocks, owners) in arrays.items()
            for block, owner in zip(blocks, owners, strict=False)
            if owner == rank
        ]
        write_part(str(work), rank, chunks)
    write_manifest(str(work), ranks, {p: "test" for p in arrays}, {"note": 1})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=chunked_array(), data=st.data())
def test_any_slice_reads_back_as_numpy_slices_it(tmp_path: Path, case, data) -> None:
    """Whatever the global shape, dtype and chunking, reading any slice equals numpy slicing the original."""
    array, blocks, owners, ranks = case
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    write_all(
        work, {"layer/kernel": (array, blocks, owners), "scalar": (np.float32(3.5).reshape(()), [()], [0])}, ranks
    )
    with ShardedReader(work) as reader:
        reader.verify()
        info = reader.variables["layer/kernel"]
        assert info.global_shape == array.shape and info.dtype == array.dtype.name and info.sharding == "test"
        for _ in range(3):
            index = data.draw(any_slice(array.shape))
            got = reader.read("layer/kernel", index)
            assert got.dtype == array.dtype
            np.testing.assert_array_equal(got, array[index])
            assert got.tobytes() == array[index].tobytes()
            needed = reader.parts_for("layer/kernel", index)
            assert needed <= set(range(ranks))
        assert reader.read("scalar").item() == 3.5
        assert reader.extra == {"note": 1}
    whole = consolidate(work)
    assert whole["layer/kernel"].tobytes() == array.tobytes()


def halves(tmp_path: Path, ranks: int = 2) -> tuple[Path, np.ndarray]:
    """A (6, 4) float32 array split in rows over ``ranks`` parts, written and manifested."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    array = np.arange(24, dtype=np.float32).reshape(6, 4)
    rows = np.linspace(0, 6, ranks + 1).astype(int)
    blocks = [((int(s), int(e)), (0, 4)) for s, e in zip(rows, rows[1:], strict=False)]
    write_all(work, {"w": (array, blocks, list(range(ranks)))}, ranks)
    return work, array


def test_parts_for_names_only_the_parts_holding_the_slice(tmp_path: Path) -> None:
    """A slice of the top rows needs part 0 only; the whole array needs both parts."""
    work, _ = halves(tmp_path)
    reader = ShardedReader(work)
    assert reader.parts_for("w", (slice(0, 2), slice(None))) == {0}
    assert reader.parts_for("w", ((3, 6), (0, 4))) == {1}
    assert reader.parts_for("w") == {0, 1}
    with pytest.raises(KeyError, match="'nope' is not a variable"):
        reader.parts_for("nope")
    with pytest.raises(ValueError, match="outside the global shape"):
        reader.read("w", ((0, 7), (0, 4)))


def test_a_part_given_in_memory_is_read_in_place_and_equals_the_mapped_read(tmp_path: Path) -> None:
    """A restore hands the reader the part it verified in memory (``loaded``): a chunk read whole is then a
    read-only view of those bytes (no copy), a slice of it or a chunk of another part is read as before, and
    all equal the mapped reads; bytes of the wrong length are not used."""
    work, array = halves(tmp_path)
    data = (work / part_bin(0)).read_bytes()
    whole = np.frombuffer(data, np.uint8)
    with ShardedReader(work, {part_bin(0): data}) as reader:
        top = reader.read("w", ((0, 3), (0, 4)))
        assert np.shares_memory(top, whole) and not top.flags.writeable
        np.testing.assert_array_equal(top, array[:3])
        rows = reader.read("w", ((1, 2), (0, 4)))  # a slice of the chunk: a copy
        assert not np.shares_memory(rows, whole)
        np.testing.assert_array_equal(rows, array[1:2])
        np.testing.assert_array_equal(reader.read("w"), array)
        assert reader.bytes_from == {0: 3 * 16 + 16 + 3 * 16, 1: 3 * 16}
    with ShardedReader(work, {part_bin(0): data[:-1]}) as reader:
        top = reader.read("w", ((0, 3), (0, 4)))
        assert not np.shares_memory(top, whole)
        np.testing.assert_array_equal(top, array[:3])


def test_a_flipped_bit_in_one_part_is_caught_naming_that_file(tmp_path: Path) -> None:
    """Corrupting one byte of part 1 makes verify() fail naming part-00001.bin; part 0 alone still verifies."""
    work, _ = halves(tmp_path)
    path = work / part_bin(1)
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0x10
    path.write_bytes(bytes(raw))
    reader = ShardedReader(work)
    reader.verify([0])
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: CRC32 is") as info:
        reader.verify()
    assert info.value.path == str(path)
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin"):
        consolidate(work)


def test_the_manifest_refuses_a_missing_or_damaged_part(tmp_path: Path) -> None:
    """write_manifest checks every part first: a missing index or a truncated .bin is named, no manifest written."""
    work, _ = halves(tmp_path)
    os.unlink(work / MANIFEST)
    (work / part_index(1)).unlink()
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.json: the part of rank 1 is missing"):
        write_manifest(str(work), 2)
    assert not (work / MANIFEST).exists()
    work2, _ = halves(tmp_path / "b")
    with open(work2 / part_bin(0), "r+b") as f:
        f.truncate(8)
    with pytest.raises(CorruptCheckpoint, match=r"part-00000\.bin: size is 8 bytes"):
        write_manifest(str(work2), 2)


def test_chunks_that_miss_or_repeat_values_are_refused(tmp_path: Path) -> None:
    """A variable whose chunks leave a hole, or cover a value twice, gets no manifest."""
    work = tmp_path / "hole"
    work.mkdir()
    a = np.zeros((4,), np.float32)
    write_part(str(work), 0, [Chunk("v", "float32", (4,), ((0, 2),), a[:2])])
    with pytest.raises(CorruptCheckpoint, match="the chunks hold 2 of its 4 values"):
        write_manifest(str(work), 1)
    twice = tmp_path / "twice"
    twice.mkdir()
    write_part(str(twice), 0, [Chunk("v", "float32", (4,), ((0, 3),), a[:3])])
    write_part(str(twice), 1, [Chunk("v", "float32", (4,), ((2, 4),), a[2:])])
    with pytest.raises(CorruptCheckpoint, match="overlap"):
        write_manifest(str(twice), 2)


def test_a_chunk_whose_data_does_not_match_its_index_is_refused() -> None:
    """Chunk() checks the data's shape and dtype against its index and dtype, naming the path."""
    with pytest.raises(ValueError, match="chunk of 'v': data is float32\\[2\\] but dtype and index say float32\\[3\\]"):
        Chunk("v", "float32", (4,), ((0, 3),), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="outside the global shape"):
        Chunk("v", "float32", (4,), ((2, 6),), np.zeros(4, np.float32))


def test_a_tampered_manifest_is_refused_before_any_byte_is_read(tmp_path: Path) -> None:
    """An offset past the end of a part in manifest.json is a CorruptCheckpoint naming manifest.json."""
    work, _ = halves(tmp_path)
    body = json.loads((work / MANIFEST).read_text())
    body["variables"]["w"]["chunks"][0]["offset"] = 10**9
    (work / MANIFEST).write_text(json.dumps(body))
    with pytest.raises(CorruptCheckpoint, match=r"manifest\.json: chunk of 'w': bytes 1000000000"):
        ShardedReader(work)


def test_rank_files_are_listed_with_size_and_crc(tmp_path: Path) -> None:
    """A rank's extra file (its train state) is written, and the manifest's file table lists it with its CRC."""
    work = tmp_path / "work"
    work.mkdir()
    state = FileSpec("train.state.p00000.npz", lambda f: f.write(b"state"))
    record = write_part(str(work), 0, [Chunk("v", "int32", (), (), np.array(7, np.int32))], files=[state])
    assert set(record.files) == {"train.state.p00000.npz", part_bin(0), part_index(0)}
    manifest = write_manifest(str(work), 1)
    assert set(manifest.files) == {"train.state.p00000.npz", part_bin(0), part_index(0), MANIFEST}
    assert manifest.files["train.state.p00000.npz"].size == 5
    assert manifest.files["train.state.p00000.npz"].crc32 == record.files["train.state.p00000.npz"].crc32
    (work / "train.state.p00000.npz").write_bytes(b"STATESTATE")
    with pytest.raises(CorruptCheckpoint, match=r"train\.state\.p00000\.npz: size is 10 bytes"):
        write_manifest(str(work), 1)


def test_the_manifest_keeps_the_crcs_the_writers_computed_and_a_later_flip_is_caught_on_read(tmp_path: Path) -> None:
    """write_manifest does not re-read the data: it lists each rank's own CRC32; a byte flipped afterwards is
    caught by the reader's check, naming the part."""
    work, _ = halves(tmp_path)
    written = json.loads((work / part_index(1)).read_text())["bin"]["crc32"]
    path = work / part_bin(1)
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    manifest = write_manifest(str(work), 2)
    assert manifest.files[part_bin(1)].crc32 == written
    with pytest.raises(CorruptCheckpoint, match=r"part-00001\.bin: CRC32 is"):
        ShardedReader(work).verify([1])


def test_thread_group_meets_broadcasts_agrees_and_times_out() -> None:
    """ThreadGroup ranks meet, get rank 0's value, agree only if all say ok, exchange values in rank order, and
    time out naming who is missing."""
    hub = ThreadGroup(3)
    results: dict[int, tuple] = {}

    def rank(g) -> None:
        g.barrier("b", 10)
        value = g.broadcast("x", "hello" if g.rank == 0 else None, 10)
        agreed = (g.all_agree("ok", g.rank != 2, 10), g.all_agree("ok2", True, 10))
        results[g.rank] = (value, *agreed, g.exchange("why", "" if g.rank != 1 else "bad", 10))

    threads = [threading.Thread(target=rank, args=(g,)) for g in hub.members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {r: ("hello", False, True, ["", "bad", ""]) for r in range(3)}
    lonely = ThreadGroup(2).members[0]
    with pytest.raises(GroupTimeout, match=r"'save/1/parts-written' within 0.05 s \(rank\(s\) 1 never came\)"):
        lonely.barrier("save/1/parts-written", 0.05)
    assert SOLO.broadcast("c", "v", 1) == "v" and SOLO.all_agree("a", True, 1) and SOLO.rank == 0
    assert SOLO.exchange("e", "v", 1) == ["v"]
