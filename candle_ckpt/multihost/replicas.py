"""Replica-parallel saving and restoring of JAX arrays: each process writes, and reads back, its share.

Save: of every block of a variable (one distinct shard index), the processes
holding a replica split it (:mod:`~candle_ckpt.storage.sliceplan`); under
DataParallel every process holds every variable, so every process writes
about ``1/N`` of the state.

Restore: the same plan, computed on the restore's processes and shardings,
says which slice each process reads. A block only this process holds is read
whole. Of a block several processes hold, each reads only its slice, and one
``multihost_utils.process_allgather`` on the training thread (after every
process said it has read, so none waits in it for a process that failed)
brings every process the others' slices; the blocks are then assembled on the
host and put on the devices with ``jax.make_array_from_callback``. So the job
reads each byte of the state from the file system once, and each process
about ``1/N`` of it, instead of ``N`` processes reading the whole of it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from candle_ckpt.storage.sharded import Index, as_index, dtype_of, shape_of
from candle_ckpt.storage.shardread import ShardedReader
from candle_ckpt.storage.sliceplan import Block, Plan, blocks_of, plan_slices


def processes() -> int:
    import jax  # noqa: PLC0415 (only reached with a JAX array)

    return int(jax.process_count())


def is_global(value: Any) -> bool:
    """A JAX array whose blocks the slicing plan covers; not a host value, nor an array local to each process of a
    multi-process job (whose values may differ: the primary's is written, whole)."""
    if not hasattr(getattr(value, "sharding", None), "devices_indices_map"):
        return False
    return not (getattr(value, "is_fully_addressable", False) and processes() > 1)


def local_blocks(value: Any, shape: tuple[int, ...]) -> dict[Index, Any]:
    """The blocks of a JAX array this process holds, by index: one shard's data each (on its device)."""
    try:
        shards = [(s.index, s.data) for s in value.addressable_shards]
    except ValueError:
        # JAX 0.10 with one device per process: a value Keras put on a mesh spanning processes raises here
        # ("input arrays must have one shard each") until a jitted step replaces it; addressable_data(k)
        # still gives the k-th addressable device's data, in the order of the sharding's own map.
        indices = value.sharding.addressable_devices_indices_map(shape).values()
        shards = [(index, value.addressable_data(k)) for k, index in enumerate(indices)]
    held: dict[Index, Any] = {}
    for index, data in shards:
        held.setdefault(as_index(index, shape), data)
    return held


def np_dtype(v: Any) -> np.dtype:
    """The numpy dtype of a Keras variable (``bfloat16`` included)."""
    return dtype_of(keras.backend.standardize_dtype(v.dtype))


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in v.shape)


Layout = tuple[tuple[str, tuple[int, ...], int, Any], ...]  # (path, shape, itemsize, sharding) per JAX array


def _layout(variables: dict[str, Any]) -> Layout:
    return tuple(
        (path, _shape(v), np_dtype(v).itemsize, v.value.sharding) for path, v in variables.items() if is_global(v.value)
    )


# The plan depends on the variables' paths, shapes and shardings only, which stay the same from one save to the
# next, while it costs ~0.8 s at 1,000 processes (360 values): computed once per layout, as Orbax caches its
# replica counts (a pure function's results; nothing a call leaves changes what another returns).
@functools.lru_cache(maxsize=4)
def _blocks_and_plan(layout: Layout) -> tuple[tuple[Block, ...], Plan]:
    blocks = []
    for path, shape, itemsize, sharding in layout:
        held = [(as_index(i, shape), (d.process_index,)) for d, i in sharding.devices_indices_map(shape).items()]
        blocks += blocks_of(path, itemsize, held)
    return tuple(blocks), plan_slices(blocks)


def state_plan(variables: dict[str, Any]) -> Plan:
    """Who writes (and reads back) which slice of every block: the same on every process, no message needed.
    The result is shared between calls with the same layout: do not change it."""
    return _blocks_and_plan(_layout(variables))[1]


def local(piece: Index, block: Index) -> tuple[slice, ...]:
    """``piece`` (a slice of the whole value) as numpy slices of the block ``block`` that holds it."""
    return tuple(slice(s - b, e - b) for (s, e), (b, _) in zip(piece, block, strict=True))


@dataclass(frozen=True)
class ReadPlan:
    """What one process reads of a checkpoint (see the module docstring).

    Attributes:
        me: The process.
        whole: ``(path, block)``: read whole (a host value: block None; a block only this process holds).
        own: ``(path, block, slice)``: this process's slices of the blocks several processes hold.
        shared: Every block several processes hold (on any process), with who reads which of its slices.
        held: The shared blocks this process holds (it assembles them from the gathered slices).
    """

    me: int
    whole: list[tuple[str, Index | None]]
    own: list[tuple[str, Index, Index]]
    shared: list[tuple[Block, list[tuple[int, Index]]]]
    held: set[tuple[str, Index]]


def read_plan(variables: dict[str, Any], me: int) -> ReadPlan:
    """What process ``me`` reads of ``variables`` (by their saved paths) under their current shardings."""
    blocks, plan = _blocks_and_plan(_layout(variables))
    by_key = {(b.key, b.index): b for b in blocks}
    whole: list[tuple[str, Index | None]] = [(p, None) for p, v in variables.items() if not is_global(v.value)]
    own, shared, held = [], [], set()
    for key in sorted(by_key):
        block, given = by_key[key], plan[key]
        if me not in block.holders:
            if len(block.holders) > 1:
                shared.append((block, given))
            continue
        if len(block.holders) == 1:
            whole.append(key)
            continue
        shared.append((block, given))
        held.add(key)
        own += [(block.key, block.index, piece) for p, piece in given if p == me]
    return ReadPlan(me, whole, own, shared, held)


@dataclass
class ShardedRead:
    """What :func:`~candle_ckpt.multihost.load.read_sharded` read on this process, before the collective.

    Attributes:
        variables: The model's variables by their saved paths.
        plan: What this process reads (:func:`read_plan`).
        values: ``(path, block)`` -> the block's values (block None: a host value, whole).
        own: ``(path, block)`` -> this process's slice of a block several processes hold.
        slice_bytes: The state bytes it took from the checkpoint's files.
        gathered_bytes: The state bytes the other processes sent it (after :meth:`assemble`).
        bytes_from: The state bytes it took from each part, by the part's rank.
        in_place_bytes: Of ``slice_bytes``, those used in place from a part the verification read into memory.
    """

    variables: dict[str, Any]
    plan: ReadPlan
    values: dict[tuple[str, Index | None], np.ndarray] = field(default_factory=dict)
    own: dict[tuple[str, Index], np.ndarray] = field(default_factory=dict)
    slice_bytes: int = 0
    gathered_bytes: int = 0
    bytes_from: dict[int, int] = field(default_factory=dict)
    in_place_bytes: int = 0

    @classmethod
    def read(cls, reader: ShardedReader, variables: dict[str, Any], plan: ReadPlan) -> ShardedRead:
        """Read everything ``plan`` gives this process, in the variables' own dtypes."""
        out = cls(variables, plan)

        def take(path: str, index: Index | None) -> np.ndarray:
            data = reader.read(path, index)
            out.slice_bytes += data.nbytes
            want = np_dtype(variables[path])
            return data if data.dtype == want else data.astype(want)

        before, in_place = dict(reader.bytes_from), reader.bytes_in_place
        for path, block in plan.whole:
            out.values[(path, block)] = take(path, block)
        for path, block, piece in plan.own:
            out.own[(path, block)] = take(path, piece)
        out.bytes_from = {r: n - before.get(r, 0) for r, n in reader.bytes_from.items() if n > before.get(r, 0)}
        out.in_place_bytes = reader.bytes_in_place - in_place
        return out

    def assemble(self) -> dict[str, tuple[Any, Any]]:
        """Every variable's value in its current sharding, as ``(variable, value)``: the one collective first
        (when some block is held by several processes; the same decision on every process)."""
        if self.plan.shared:
            self._gather()
        import_jax = any(is_global(v.value) for v in self.variables.values())
        arrays = {}
        for path, v in self.variables.items():
            if (path, None) in self.values:
                arrays[path] = (v, self.values[(path, None)])
                continue
            shape = _shape(v)

            def block(index: Any, path: str = path, shape: tuple[int, ...] = shape) -> np.ndarray:
                return self.values[(path, as_index(index, shape))]

            if import_jax:
                import jax  # noqa: PLC0415 (only reached with a JAX array)

                arrays[path] = (v, jax.make_array_from_callback(shape, v.value.sharding, block))
        return arrays

    def _gather(self) -> None:
        """One ``process_allgather`` of every process's slices of the shared blocks; assemble the held ones."""
        from jax.experimental import multihost_utils  # noqa: PLC0415

        sizes: dict[int, int] = {}
        where: dict[tuple[str, Index, int], tuple[int, int]] = {}  # (path, block, process) -> (offset, nbytes)
        for block, given in self.plan.shared:
            dtype = np_dtype(self.variables[block.key])
            for p, piece in given:
                n = int(np.prod(shape_of(piece), dtype=np.int64)) * dtype.itemsize
                where[(block.key, block.index, p)] = (sizes.get(p, 0), n)
                sizes[p] = sizes.get(p, 0) + n
        longest = max(sizes.values(), default=0)
        mine = np.zeros(max(longest, 1), np.uint8)
        for (path, block, p), (offset, n) in where.items():
            if p == self.plan.me:
                mine[offset : offset + n] = np.ascontiguousarray(self.own[(path, block)]).reshape(-1).view(np.uint8)
        everyone = np.asarray(multihost_utils.process_allgather(mine))  # (processes, longest): training thread
        for block, given in self.plan.shared:
            if (block.key, block.index) not in self.plan.held:
                continue
            dtype = np_dtype(self.variables[block.key])
            out = np.empty(shape_of(block.index), dtype)
            for p, piece in given:
                offset, n = where[(block.key, block.index, p)]
                if p != self.plan.me:
                    self.gathered_bytes += n
                out[local(piece, block.index)] = everyone[p, offset : offset + n].view(dtype).reshape(shape_of(piece))
            self.values[(block.key, block.index)] = out
        self.own.clear()
