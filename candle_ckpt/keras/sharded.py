"""A Keras 3 model of a multi-process JAX job: each process writes its share, and reads back its share.

Capture (every process, on the training thread): for every model and optimizer
variable, the slices :func:`~candle_ckpt.keras.replicas.state_plan` gives this
process. The processes holding a block split it between them, so every value
is written exactly once across the job and, under DataParallel (every process
holds everything), each process writes about ``1/N`` of the state. They become
this process's part (:func:`~candle_ckpt.storage.sharded.write_part`), with its
training state ``train.state.pRRRRR.npz``; the primary adds the model's Keras
config (``config.json``, ``metadata.json``, as in a ``.keras`` archive).
Variables are named by their Keras ``variable.path`` (docs/format.rst).

Restore: each process reads its share of every variable from the parts that
hold it (:class:`~candle_ckpt.storage.shardread.ShardedReader`): a block only
it holds, whole; of a block several processes hold, its slice, the rest coming
from the others by one collective (:mod:`~candle_ckpt.keras.replicas`). Values
go into the variables' current shardings with ``jax.make_array_from_callback``,
so the checkpoint restores under any number of processes, any mesh, or no
distribution. Shapes and dtypes are checked first, every share is read, and
only when every process says it has read its share does any process gather and
assign (all or nothing, on every process).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import keras
import numpy as np

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.dtypes import counter_fits
from candle_ckpt.core.errors import ModelMismatch, NoValidCheckpoint
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.distributed.jax_group import jax_group
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.pending import Pending
from candle_ckpt.keras import internals
from candle_ckpt.keras.preflight import build_optimizer
from candle_ckpt.keras.replicas import ShardedRead, is_global, local, local_blocks, read_plan, state_plan
from candle_ckpt.keras.state import KERAS_VERSION, backend_name
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.sharded import MANIFEST, Chunk, Index, dtype_of, part_bin, part_index, write_part
from candle_ckpt.storage.shardread import ShardedReader
from candle_ckpt.storage.sliceplan import slices_of

CONFIG_FILE, METADATA_FILE = "config.json", "metadata.json"
ORDER = "keras_variable_order"  # the manifest's extra: the paths in model-then-optimizer variable order


def keras_group() -> Group:
    """This process's group when JAX runs several processes (:func:`~candle_ckpt.distributed.jax_group.jax_group`),
    refusing at once where Keras does not run on JAX: its variables are then no JAX arrays, and every save
    would fail.

    Raises:
        RuntimeError: ``jax.distributed`` is initialized but the Keras backend is not JAX (naming the fix).
    """
    group = jax_group()  # SOLO in one process
    if group.size > 1 and keras.backend.backend() != "jax":
        raise RuntimeError(
            f"jax.distributed is initialized (process {group.rank} of {group.size}) but Keras runs on "
            f"{keras.backend.backend()}: set KERAS_BACKEND=jax before importing keras"
        )
    return group


def train_state_part(rank: int) -> str:
    """The name of rank ``rank``'s training state file: ``train.state.p00001.npz``."""
    return f"train.state.p{rank:05d}.npz"


def state_variables(model: Any) -> dict[str, Any]:
    """The model's and its optimizer's variables by ``variable.path`` (the optimizer built first).

    Raises:
        ValueError: two different variables share a path (the checkpoint could not tell them apart).
    """
    build_optimizer(model)
    opt = getattr(model, "optimizer", None)
    found: dict[str, Any] = {}
    for v in list(model.variables) + list(opt.variables if opt is not None else []):
        other = found.setdefault(v.path, v)
        if other is not v:
            raise ValueError(
                f"two variables of the model share the path {v.path!r}: a sharded checkpoint names variables "
                "by path; give the layers (or optimizers) distinct names"
            )
    return found


def variables_of(source: Any) -> dict[str, Any]:
    """``source`` if it is already ``{path: variable}``, else :func:`state_variables` of the model ``source``."""
    return source if isinstance(source, dict) else state_variables(source)


class SpareChunks:
    """The host buffers of an async capture's chunks, reused by the next capture once they are written.

    As :meth:`~candle_ckpt.keras.state.ModelState.snapshot` does for one process: after the first save a
    capture is one ``memcpy`` per chunk into memory already mapped (a fresh ``np.array`` of a 128 MiB share
    page-faults on every page, every save). The engine waits for the write in flight before the next capture,
    so the buffers are free by then; a write that failed or never finished leaves them busy, and the next
    capture takes fresh ones (never writing over buffers a write may still read).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, Index | None], np.ndarray] = {}
        self._busy = False

    def buffer(self, key: tuple[str, Index | None], like: np.ndarray) -> np.ndarray:
        """An owned buffer shaped as ``like``: the last capture's for ``key`` when it is free and fits."""
        old = None if self._busy else self._buffers.get(key)
        return old if old is not None and old.shape == like.shape and old.dtype == like.dtype else _empty(like)

    def hold(self, buffers: dict[tuple[str, Index | None], np.ndarray]) -> None:
        """The buffers of the capture just taken: busy until :meth:`written`."""
        self._buffers, self._busy = buffers, True

    def written(self) -> None:
        self._busy = False


def _empty(like: np.ndarray) -> np.ndarray:
    return np.empty(like.shape, like.dtype)  # C order, whatever the source's strides


def _owned(data: np.ndarray, key: tuple[str, Index | None], spare: SpareChunks | None, taken: dict) -> np.ndarray:
    """An owned C-ordered copy of ``data`` (in a spare buffer where one is free), recorded in ``taken``."""
    dst = spare.buffer(key, data) if spare is not None else _empty(data)
    np.copyto(dst, data)
    taken[key] = dst
    return dst


def capture_chunks(
    model: Any, rank: int, copy: bool, spare: SpareChunks | None = None
) -> tuple[list[Chunk], dict[str, str]]:
    """This process's chunks of every variable of ``model`` (or of ``{path: variable}``), and their shardings.

    Of a JAX array, the slices :func:`state_plan` gives process ``rank``; of a host value, the whole, on rank 0.
    ``copy``: owned copies (an async save), in ``spare``'s buffers where they are free.
    """
    variables = variables_of(model)
    mine: dict[str, list[tuple[Index, Index]]] = {}
    for (path, block), piece in slices_of(state_plan(variables), rank).items():
        mine.setdefault(path, []).append((block, piece))
    chunks, sharding, taken = [], {}, {}
    for path, v in variables.items():
        value = v.value
        sharding[path] = str(getattr(value, "sharding", "host"))
        shape = tuple(int(n) for n in v.shape)
        if not is_global(value):
            if rank == 0:
                data = _owned(np.asarray(value), (path, None), spare, taken) if copy else np.asarray(value)
                chunks.append(Chunk(path, data.dtype.name, shape, None, np.require(data, requirements="C")))
            continue
        held = local_blocks(value, shape)
        for block, piece in mine.get(path, ()):
            data = np.asarray(held[block])[local(piece, block)]
            data = _owned(data, (path, piece), spare, taken) if copy else data
            chunks.append(Chunk(path, data.dtype.name, shape, piece, np.require(data, requirements="C")))
    if copy and spare is not None:
        spare.hold(taken)
    return chunks, sharding


def capture_sharded(
    model: Any, cfg: CkptConfig, group: Group, train_state: bytes | None, spare: SpareChunks | None = None
) -> Capture:
    """The capture of a multi-process save: this process's part (and, on the primary, the model's config)."""
    start = time.perf_counter()
    copy = bool(cfg.async_save)
    chunks, sharding = capture_chunks(model, group.rank, copy=copy, spare=spare)
    own: list[FileSpec] = []
    if train_state is not None:
        own.append(FileSpec(train_state_part(group.rank), lambda f: f.write(train_state)))
    files: list[FileSpec] = []
    if is_primary(group) and not cfg.save_weights_only:
        config_json, metadata_json = internals.serialize_model_as_json(model)
        files = [
            FileSpec(CONFIG_FILE, lambda f: f.write(config_json.encode())),
            FileSpec(METADATA_FILE, lambda f: f.write(metadata_json.encode())),
        ]

    def parts(work: str) -> None:
        write_part(work, group.rank, chunks, files=own)
        if copy and spare is not None:
            spare.written()  # the next capture may copy into these buffers

    return Capture(
        files=files,
        model_file=MANIFEST,
        nbytes=sum(c.data.nbytes for c in chunks) + len(train_state or b""),
        snapshot_s=time.perf_counter() - start,
        keras_version=KERAS_VERSION,
        backend=backend_name(),
        parts=parts,
        sharding=sharding,
        manifest_extra={ORDER: list(sharding)},
    )


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
