"""A Keras 3 model's share of a multi-process JAX restore: each process reads back its share.

Each process reads its share of every variable from the parts that
hold it (:class:`~candle_ckpt.storage.shardread.ShardedReader`): a block only
it holds, whole; of a block several processes hold, its slice, the rest coming
from the others by one collective (:mod:`~candle_ckpt.multihost.replicas`). Values
go into the variables' current shardings with ``jax.make_array_from_callback``,
so the checkpoint restores under any number of processes, any mesh, or no
distribution. Shapes and dtypes are checked first, every share is read, and
only when every process says it has read its share does any process gather and
assign (all or nothing, on every process). What a save writes: :mod:`candle_ckpt.multihost.save`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import keras
import numpy as np

from candle_ckpt.core.dtypes import counter_fits
from candle_ckpt.core.errors import ModelMismatch, NoValidCheckpoint
from candle_ckpt.engine.pending import Pending
from candle_ckpt.multihost.replicas import ShardedRead, is_global, read_plan
from candle_ckpt.multihost.save import ORDER, train_state_part, variables_of
from candle_ckpt.storage.sharded import MANIFEST, dtype_of, part_bin, part_index
from candle_ckpt.storage.shardread import ShardedReader


def _by_position(variables: dict[str, Any], reader: ShardedReader) -> dict[str, Any] | None:
    """The model's variables keyed by the saved paths, matched by position, when only their names differ.

    Keras numbers the names of a second model or optimizer in one process (``adam_1/...``,
    ``dense_1/...``): the same model's variables then have other paths than when it was saved.
    """
    order = reader.extra.get(ORDER)
    if not isinstance(order, list) or len(order) != len(variables) or set(order) != set(reader.variables):
        return None
    matched = {}
    for saved, v in zip(order, variables.values(), strict=True):
        info = reader.variables[saved]
        if tuple(info.global_shape) != tuple(int(n) for n in v.shape):
            return None
        matched[saved] = v
    return matched


def _check(variables: dict[str, Any], reader: ShardedReader, where: str) -> None:
    """Every variable of the model is in the checkpoint with its shape and a dtype that loads into its own
    (:func:`~candle_ckpt.core.dtypes.counter_fits`: Adam's int32 iteration under int64, across backends), and
    nothing else is."""
    saved = {p: info for p, info in reader.variables.items() if not p.startswith("_")}
    problems = [f"{p}: not in the checkpoint" for p in variables if p not in saved]
    problems += [f"{p}: in the checkpoint but not in the model" for p in saved if p not in variables]
    for p, v in variables.items():
        info = saved.get(p)
        if info is None:
            continue
        shape, dtype = tuple(int(n) for n in v.shape), keras.backend.standardize_dtype(v.dtype)
        size = int(np.prod(info.global_shape, dtype=np.int64))
        fits = counter_fits(info.dtype, dtype_of(dtype).name, size, lambda p=p: reader.read(p))
        if tuple(info.global_shape) != shape or not fits:
            problems.append(f"{p}: checkpoint {info.dtype}{list(info.global_shape)} != model {dtype}{list(shape)}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ModelMismatch(f"checkpoint {where} does not match the model: {shown}; nothing was loaded")


def _open(model: Any, reader: ShardedReader, where: str) -> dict[str, Any]:
    """The model's variables by their saved paths (matched by position when only the names differ), checked."""
    variables = variables_of(model)
    if not set(variables) <= set(reader.variables):
        variables = _by_position(variables, reader) or variables
    _check(variables, reader, where)
    return variables


def read_sharded(model: Any, where: str, loaded: Mapping[str, Any] | None = None) -> ShardedRead:
    """This process's share of every variable, read from ``where``; nothing assigned, no collective yet.

    ``model``: a model, or ``{path: variable}``. Of a block that only this process holds it reads the block;
    of a block several processes hold (a replicated value), only its own slice (:func:`read_plan`): the
    others' slices come in :func:`assign_all`, by one collective. ``loaded``: verified files already in
    memory (the verification's contents: :func:`kept_parts`), used instead of reading their parts again.

    Raises:
        ModelMismatch: the checkpoint's variables, shapes or dtypes differ from the model's.
    """
    with ShardedReader(where, loaded) as reader:
        variables = _open(model, reader, where)
        return ShardedRead.read(reader, variables, read_plan(variables, _process_index(variables)))


def _process_index(variables: dict[str, Any]) -> int:
    """This process's JAX process index (0 when no variable is a JAX array: jax is then not imported)."""
    if not any(is_global(v.value) for v in variables.values()):
        return 0
    import jax  # noqa: PLC0415 (only reached with a JAX array)

    return int(jax.process_index())


def assign_all(read: ShardedRead) -> None:
    """Assign what :func:`read_sharded` read, after the one collective that brings the others' slices.

    Call it on every process of the job once all have read (:func:`read_all_or_none`): the gather waits for all.
    """
    for v, value in read.assemble().values():
        v.assign(value)


def read_all_or_none(read: Callable[[], Any], where: str, agree: Callable[[bool], bool] | None) -> Any:
    """``read()`` on this process, then ``agree(ok)`` with the others: what it read once every process has read its
    part; raises (so nothing is assigned anywhere) when this one or another could not.

    Raises:
        NoValidCheckpoint: another process could not read its part of ``where``; this one's own error otherwise.
    """
    result, failure = None, None
    try:
        result = read()
    except Exception as err:  # told to the others first: every process loads, or none
        failure = err
    if agree is not None and not agree(failure is None):
        if failure is not None:
            raise failure
        raise NoValidCheckpoint(f"another process could not read {where} (see its log); nothing was loaded")
    if failure is not None:
        raise failure
    return result


def load_sharded(
    model: Any,
    contents: dict[str, Any],
    where: str,
    log: Any,
    rank: int = 0,
    agree: Callable[[bool], bool] | None = None,
    stats: dict[str, Any] | None = None,
) -> Pending:
    """Load a sharded checkpoint into ``model`` on process ``rank``; return the state to apply when fit starts.

    ``agree(ok)`` (a multi-process restore) is called once every slice is read: True iff every
    process read its slices. Only then is anything assigned, on every process or on none.
    ``stats``, if given, gets what this process read (:func:`read_stats`).

    Raises:
        ModelMismatch: the checkpoint does not match the model (nothing is assigned anywhere).
        NoValidCheckpoint: another process could not read its slices (nothing is assigned).
    """
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"{where} is a sharded (multi-process) checkpoint, whose optimizer state is stored like the "
            "weights: call model.compile(...) before restart()"
        )
    read = read_all_or_none(lambda: read_sharded(model, where, contents), where, agree)
    assign_all(read)
    if stats is not None:
        stats.update(read_stats(read, where, rank))
    data = contents.get(train_state_part(rank))
    if data is None:
        log.warning(
            f"restart: {where} holds no training state for process {rank} (it was written by fewer "
            "processes): this process's RNG and input position start fresh"
        )
        return Pending()
    return Pending(train_state=bytes(data))


def checked_parts(part_count: int, rank: int, processes: int) -> list[int]:
    """The parts of a checkpoint whose CRC32 process ``rank`` of ``processes`` checks at restore: ``r`` with
    ``r % processes == rank``.

    Every part is checked once across the job, by one process, and a restore goes on only when every process
    found its parts sound (all or none), so a process need not check the parts it reads slices from: a part
    read by several processes (a one-writer checkpoint, or one of another process count) is read whole once,
    not once per process. With the same process count, each process checks exactly its own part.
    """
    return list(range(rank, part_count, max(processes, 1)))


def files_to_read(model: Any, where: str, rank: int) -> set[str]:
    """The files of the sharded checkpoint ``where`` whose CRC32 process ``rank`` checks at restore: the
    manifest, its training state, and the parts :func:`checked_parts` gives it (their ``.bin`` and ``.json``).

    ``model`` (a model, or ``{path: variable}``) is not needed: which process checks which part depends on the
    process count only.

    Raises:
        CheckpointError: the manifest cannot be read (the verification then fails, naming it).
    """
    del model  # kept in the signature for the callers (agree_on_checkpoint's needed(where))
    with ShardedReader(where) as reader:
        parts = checked_parts(reader.process_count, rank, _process_count())
    return {MANIFEST, train_state_part(rank)} | {name for r in parts for name in (part_bin(r), part_index(r))}


def kept_parts(names: Iterable[str], rank: int) -> set[str]:
    """Of a sharded checkpoint's files ``names``, the part process ``rank`` reads whole at restore, once for its
    CRC and its values (``keep`` of :func:`~candle_ckpt.engine.group_restore.agree_on_checkpoint`): its own part
    when the checkpoint has as many parts as the job has processes (each then reads back what it wrote, with the
    shardings it was written with), none otherwise (an elastic restore checks the parts it is given, then copies
    its slices out of the mapped parts it needs).

    One read into memory is the fastest path measured (a cold 128 MiB part on the 2-core machine, 2026-11-28:
    about 0.1 s, against 0.13 to 0.7 s to check it by chunks and then copy the slices out of a mapping): the
    file is read once, its CRC computed in memory, and whole chunks are used in place, without a copy.
    """
    parts = sum(1 for name in names if name.startswith("part-") and name.endswith(".bin"))
    return {part_bin(rank)} if parts == _process_count() else set()


def _process_count() -> int:
    import jax  # noqa: PLC0415 (a multi-process restore: JAX is running)

    return int(jax.process_count())


def read_stats(read: ShardedRead, where: str, rank: int) -> dict[str, int]:
    """What process ``rank`` read of ``where``: ``read_bytes`` (the files it checked, whole, plus what it took
    from the other parts), ``checked_bytes``, ``slice_bytes`` (of which ``in_place_bytes`` were used in place
    from its part, read once into memory) and ``gathered_bytes``."""
    names = files_to_read(None, where, rank)
    checked = sum(os.path.getsize(os.path.join(where, n)) for n in names if os.path.isfile(os.path.join(where, n)))
    mine = {r for r in read.bytes_from if part_bin(r) in names}
    elsewhere = sum(n for r, n in read.bytes_from.items() if r not in mine)
    return {
        "read_bytes": checked + elsewhere,
        "checked_bytes": checked,
        "slice_bytes": read.slice_bytes,
        "in_place_bytes": read.in_place_bytes,
        "gathered_bytes": read.gathered_bytes,
    }
