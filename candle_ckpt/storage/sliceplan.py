"""Who writes (and, at restore, who reads) which slice of a value that several processes hold.

Under DataParallel every process holds every variable whole. Written by the
holder of its first replica, the whole state would come from one process, and
the save time could not fall as processes are added. Orbax's replica-parallel
saving (``orbax/checkpoint/_src/serialization/replica_slices.py``) splits a
replicated array between its replicas instead; this is the same idea at the
granularity that matters for a shared file system, the process.

The rule, for every block of a value (a block: one distinct shard index; the
processes holding a replica of it are its *holders*):

- one holder: it takes the block whole;
- ``R`` holders: the block is cut along its first axis at least ``P`` long into
  ``P = min(R, nbytes // MIN_SLICE_BYTES)`` contiguous row ranges whose sizes
  differ by at most one row (if no axis is that long, along its longest axis
  into as many pieces as it has rows); ``P <= 1`` (a small value) means whole.
  Cuts along the first axis keep each slice contiguous in C order, so it is a
  view of the shard, written without a copy.
- Pieces go to holders by load: blocks are taken largest first, and a block's
  pieces, largest first, go to its least-loaded holders (fewest bytes so far,
  then the lowest process index). Small values, given whole, fill the gaps, so
  under DataParallel the largest process writes at most ``total / N`` plus one
  piece or small value (:func:`plan_slices` proves nothing more; the unit tests
  check this bound).

``MIN_SLICE_BYTES`` bounds the number of chunks: a checkpoint has at most
``state bytes / 64 KiB`` split chunks (plus one per small value), so the
manifest stays small at 1,000 processes, and a slice never costs more in its
index row and alignment padding than ~0.4 % of its bytes.

The plan is a pure function of the blocks (paths, shapes, item sizes and
holders), which every process of a job computes alike from the variables'
shardings: no message is exchanged. If processes ever disagreed, the
primary's check that the chunks cover each array exactly once
(:func:`~candle_ckpt.storage.manifest.check_cover`) refuses the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Index = tuple[tuple[int, int], ...]

MIN_SLICE_BYTES = 64 << 10  # never cut a value into slices smaller than this


@dataclass(frozen=True)
class Block:
    """One block of one value and the processes that hold it.

    Attributes:
        key: The value's name (a variable path).
        index: ``(start, stop)`` per dimension of the block in the whole value.
        itemsize: Bytes per element.
        holders: The processes holding a replica of the block (at least one).
    """

    key: str
    index: Index
    itemsize: int
    holders: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for start, stop in self.index:
            n *= stop - start
        return n


# (key, block index) -> [(process, slice index)]: the slices of each block and who takes each.
Plan = dict[tuple[str, Index], list[tuple[int, Index]]]


def pieces(index: Index, itemsize: int, holders: int, min_slice_bytes: int = MIN_SLICE_BYTES) -> list[Index]:
    """The slices one block is cut into for ``holders`` processes, largest first (see the module docstring)."""
    nbytes = itemsize
    for start, stop in index:
        nbytes *= stop - start
    want = min(holders, nbytes // max(min_slice_bytes, 1))
    if want <= 1 or not index:
        return [index]
    lengths = [stop - start for start, stop in index]
    axis = next((i for i, n in enumerate(lengths) if n >= want), None)
    if axis is None:
        axis = lengths.index(max(lengths))
        want = lengths[axis]
    if want <= 1:
        return [index]
    start, stop = index[axis]
    size, extra = divmod(stop - start, want)
    out, at = [], start
    for k in range(want):
        end = at + size + (1 if k < extra else 0)
        out.append((*index[:axis], (at, end), *index[axis + 1 :]))
        at = end
    return out


def plan_slices(blocks: Iterable[Block], min_slice_bytes: int = MIN_SLICE_BYTES) -> Plan:
    """Who takes which slice of every block: see the module docstring for the rule.

    Raises:
        ValueError: a block has no holder, or the same block is given twice.
    """
    todo = sorted(blocks, key=lambda b: (-b.nbytes, b.key, b.index))
    load: dict[int, int] = {}
    plan: Plan = {}
    for block in todo:
        if not block.holders:
            raise ValueError(f"{block.key} {list(block.index)}: a block needs at least one holder")
        if (block.key, block.index) in plan:
            raise ValueError(f"{block.key} {list(block.index)}: the block is given twice")
        holders = sorted(set(block.holders), key=lambda p: (load.get(p, 0), p))
        cut = pieces(block.index, block.itemsize, len(holders), min_slice_bytes)
        given = []
        for process, piece in zip(holders, cut, strict=False):
            given.append((process, piece))
            load[process] = load.get(process, 0) + Block(block.key, piece, block.itemsize, ()).nbytes
        plan[(block.key, block.index)] = given
    return plan


def slices_of(plan: Plan, process: int) -> dict[tuple[str, Index], Index]:
    """The slices ``process`` takes: ``(key, block index) -> slice index`` (at most one per block)."""
    return {block: piece for block, given in plan.items() for p, piece in given if p == process}


def loads(plan: Plan, itemsizes: dict[str, int]) -> dict[int, int]:
    """Bytes per process under ``plan`` (``itemsizes``: per key)."""
    out: dict[int, int] = {}
    for (key, _), given in plan.items():
        for process, piece in given:
            out[process] = out.get(process, 0) + Block(key, piece, itemsizes[key], ()).nbytes
    return out


def blocks_of(key: str, itemsize: int, holders_by_index: Sequence[tuple[Index, Iterable[int]]]) -> list[Block]:
    """The :class:`Block` s of one value from ``(block index, holding processes)`` pairs (repeats merged)."""
    merged: dict[Index, set[int]] = {}
    for index, holders in holders_by_index:
        merged.setdefault(tuple(index), set()).update(holders)
    return [Block(key, index, itemsize, tuple(sorted(h))) for index, h in merged.items()]
