"""The replica-parallel slicing plan: who writes (and reads back) which slice of a value several processes hold.

Random values, shardings and holder sets (hypothesis): the slices of every block cover it exactly once, only
holders take slices, each holder at most one slice of a block; under DataParallel (every process holds every
value) the processes' bytes differ by at most one unsplittable item, and a written plan passes the manifest's
own cover check.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from candle_ckpt.core.dtypes import counter_fits
from candle_ckpt.storage.manifest import write_manifest
from candle_ckpt.storage.sharded import Chunk, overlap, shape_of, write_part
from candle_ckpt.storage.shardread import ShardedReader
from candle_ckpt.storage.sliceplan import MIN_SLICE_BYTES, Block, loads, pieces, plan_slices, slices_of

SMALL = 64  # a min slice size that makes the small random values split


def _count(index) -> int:
    return int(np.prod(shape_of(index), dtype=np.int64))


@st.composite
def values(draw, processes: int | None = None):
    """Random values, each cut into a random grid of blocks, each block held by a random set of processes."""
    n = processes or draw(st.integers(1, 8))
    out = []
    for k in range(draw(st.integers(1, 6))):
        shape = tuple(draw(st.lists(st.integers(0, 40), max_size=3)))
        itemsize = draw(st.sampled_from([1, 2, 4, 8]))
        cuts = [sorted({0, n_, *draw(st.lists(st.integers(0, n_), max_size=2))}) for n_ in shape]
        blocks = [()]
        for c in cuts:
            parts = [(s, e) for s, e in zip(c, c[1:], strict=False)] or [(0, 0)]
            blocks = [(*b, p) for b in blocks for p in parts]
        for index in blocks:
            if processes is not None:
                holders = tuple(range(n))
            else:
                holders = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1))))
            out.append(Block(f"v{k}", index, itemsize, holders))
    return out


@settings(max_examples=300, deadline=None)
@given(blocks=values(), min_slice=st.sampled_from([1, SMALL, MIN_SLICE_BYTES]))
def test_the_slices_of_every_block_cover_it_exactly_once(blocks, min_slice) -> None:
    """Every block's slices lie inside it, do not overlap, add up to it; only holders take one, at most one each."""
    plan = plan_slices(blocks, min_slice)
    assert set(plan) == {(b.key, b.index) for b in blocks}
    for b in blocks:
        given = plan[(b.key, b.index)]
        owners = [p for p, _ in given]
        assert set(owners) <= set(b.holders) and len(owners) == len(set(owners)) >= 1
        for _, piece in given:
            assert overlap(piece, b.index) == piece or _count(piece) == 0
        for i, (_, a) in enumerate(given):
            for _, c in given[i + 1 :]:
                assert overlap(a, c) is None
        assert sum(_count(piece) for _, piece in given) == _count(b.index)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 8), min_slice=st.sampled_from([1, SMALL, MIN_SLICE_BYTES]))
def test_under_data_parallel_no_process_writes_more_than_its_share_plus_one_item(data, n, min_slice) -> None:
    """Every process holds every value: the heaviest process has at most one piece or whole value more than the
    lightest, so at most total/N plus that item."""
    blocks = data.draw(values(processes=n))
    plan = plan_slices(blocks, min_slice)
    per = loads(plan, {b.key: b.itemsize for b in blocks})
    got = [per.get(p, 0) for p in range(n)]
    items = [Block(key, piece, b.itemsize, ()).nbytes for b in blocks for key, piece in [(b.key, pc) for pc in
             pieces(b.index, b.itemsize, n, min_slice)]]  # fmt: skip
    assert max(got) - min(got) <= max(items, default=0)
    assert max(got) <= sum(got) / n + max(items, default=0)


def test_a_large_replicated_value_is_cut_in_near_equal_row_ranges() -> None:
    """A 1000 x 300 float32 value (1.2 MB) on 8 processes: 8 slices of 125 rows, one per process."""
    index = ((0, 1000), (0, 300))
    plan = plan_slices([Block("w", index, 4, tuple(range(8)))])
    given = sorted(plan[("w", index)], key=lambda pair: pair[1])
    assert [piece for _, piece in given] == [((k * 125, k * 125 + 125), (0, 300)) for k in range(8)]
    assert sorted(p for p, _ in given) == list(range(8))
    odd = pieces(((0, 10), (0, 3)), 4, 4, min_slice_bytes=1)  # rows differ by at most one, largest first
    assert [shape_of(p)[0] for p in odd] == [3, 3, 2, 2]


def test_small_values_go_whole_to_the_least_loaded_holder() -> None:
    """Values under 2 x 64 KiB are not cut: given whole, largest first, to whoever has written least."""
    blocks = [Block(f"b{k}", ((0, 100 * (k + 1)),), 4, (0, 1)) for k in range(4)]  # 400, 800, 1200, 1600 bytes
    plan = plan_slices(blocks)
    assert all(len(plan[(b.key, b.index)]) == 1 for b in blocks)
    assert loads(plan, dict.fromkeys(["b0", "b1", "b2", "b3"], 4)) == {0: 2000, 1: 2000}
    assert slices_of(plan, 1) == {("b2", ((0, 300),)): ((0, 300),), ("b1", ((0, 200),)): ((0, 200),)}


def test_no_axis_long_enough_cuts_the_longest_into_single_rows() -> None:
    """A (3, 5) value on 8 processes with tiny slices allowed: 5 columns, one each, to 5 of the 8."""
    got = pieces(((0, 3), (0, 5)), 4, 8, min_slice_bytes=1)
    assert got == [((0, 3), (k, k + 1)) for k in range(5)]
    assert pieces((), 4, 8, min_slice_bytes=1) == [()]  # a scalar: whole


def test_a_block_without_holders_or_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one holder"):
        plan_slices([Block("w", ((0, 4),), 4, ())])
    with pytest.raises(ValueError, match="given twice"):
        plan_slices([Block("w", ((0, 4),), 4, (0,)), Block("w", ((0, 4),), 4, (1,))])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 5), rows=st.integers(1, 30), cols=st.integers(1, 9))
def test_parts_written_by_the_plan_pass_the_manifest_and_read_back_whole(tmp_path: Path, n, rows, cols) -> None:
    """Each process writes its slices of a replicated value and of a scalar; the manifest accepts the cover
    and a reader returns the value bit for bit."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    value = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    scalar = np.array(7, np.int64)
    blocks = [Block("w", ((0, rows), (0, cols)), 4, tuple(range(n))), Block("s", (), 8, tuple(range(n)))]
    plan = plan_slices(blocks, min_slice_bytes=4)
    for p in range(n):
        chunks = []
        for (key, _), piece in slices_of(plan, p).items():
            src = value if key == "w" else scalar
            data = np.array(src[tuple(slice(s, e) for s, e in piece)], order="C")
            chunks.append(Chunk(key, src.dtype.name, src.shape, piece, data))
        write_part(str(work), p, chunks)
    write_manifest(str(work), n)
    with ShardedReader(work) as reader:
        assert reader.read("w").tobytes() == value.tobytes() and reader.read("s").item() == 7


def test_counters_cross_integer_widths_only_when_small_and_in_range() -> None:
    """Adam's iteration (int32 under JAX, int64 under TF) loads either way; floats, large arrays and overflow
    do not."""
    assert counter_fits("int32", "int64", 1, lambda: np.array(5, np.int32))
    assert counter_fits("int64", "int32", 1, lambda: np.array(5, np.int64))
    assert not counter_fits("int64", "int32", 1, lambda: np.array(2**40, np.int64))
    assert not counter_fits("float32", "float64", 1, lambda: np.array(1.0))
    assert not counter_fits("int32", "int64", 5000, lambda: np.zeros(5000, np.int32))
    assert not counter_fits("bfloat16", "float32", 1, lambda: np.zeros(1))
