"""A Keras 3 model of a multi-process JAX job: each process captures its own shards, and reads back only its slices.

Capture (every process, on the training thread): for every model and optimizer
variable, the shards this process holds with ``replica_id == 0``, so every value
is written exactly once across the job (a replicated value once, by the process
holding its first replica). They become this process's part
(:func:`~candle_ckpt.storage.sharded.write_part`), with its training state
``train.state.pRRRRR.npz``; the primary adds the model's Keras config
(``config.json``, ``metadata.json``, as in a ``.keras`` archive). Variables are
named by their Keras ``variable.path`` (docs/format.rst).

Restore: every variable's slice of this process is read from the parts that
hold it (:class:`~candle_ckpt.storage.shardread.ShardedReader`) into the
variable's current sharding with ``jax.make_array_from_callback``: no process
gathers a whole array, and the checkpoint restores under any number of
processes, any mesh, or no distribution. Shapes and dtypes are checked first,
every array is read, and only when every process says it has read its slices
does any process assign (all or nothing, on every process).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.errors import ModelMismatch, NoValidCheckpoint
from candle_ckpt.core.group import Group
from candle_ckpt.engine.capture import Capture
from candle_ckpt.engine.pending import Pending
from candle_ckpt.keras import internals
from candle_ckpt.keras.preflight import build_optimizer
from candle_ckpt.keras.state import KERAS_VERSION, backend_name
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.sharded import MANIFEST, Chunk, part_bin, part_index, write_part
from candle_ckpt.storage.shardread import ShardedReader

CONFIG_FILE, METADATA_FILE = "config.json", "metadata.json"
ORDER = "keras_variable_order"  # the manifest's extra: the paths in model-then-optimizer variable order


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


def _shards(value: Any, copy: bool) -> list[tuple[Any, np.ndarray]]:
    """``(index, host data)`` of each shard of ``value`` this process writes: its replica 0 shards."""
    shards = getattr(value, "addressable_shards", None)
    if shards is None or (getattr(value, "is_fully_addressable", False) and _processes() > 1):
        # A host value, or an array local to each process of a multi-process job: the primary's is written.
        return [(None, np.array(value, copy=copy))]
    out = []
    for shard in shards:
        if shard.replica_id == 0:
            data = np.asarray(shard.data)
            out.append((shard.index, np.array(data, copy=True) if copy else data))
    return out


def _processes() -> int:
    import jax  # noqa: PLC0415 (only reached with a JAX array)

    return int(jax.process_count())


def capture_chunks(model: Any, rank: int, copy: bool) -> tuple[list[Chunk], dict[str, str]]:
    """This process's chunks of every variable of ``model`` (or of ``{path: variable}``), and their shardings."""
    chunks, sharding = [], {}
    for path, v in variables_of(model).items():
        value = v.value
        sharding[path] = str(getattr(value, "sharding", "host"))
        shape = tuple(int(n) for n in v.shape)
        for index, data in _shards(value, copy):
            if index is None and rank != 0:
                continue
            chunks.append(Chunk(path, data.dtype.name, shape, index, np.require(data, requirements="C")))
    return chunks, sharding


def capture_sharded(model: Any, cfg: CkptConfig, group: Group, train_state: bytes | None) -> Capture:
    """The capture of a multi-process save: this process's part (and, on the primary, the model's config)."""
    start = time.perf_counter()
    chunks, sharding = capture_chunks(model, group.rank, copy=cfg.async_save)
    own: list[FileSpec] = []
    if train_state is not None:
        own.append(FileSpec(train_state_part(group.rank), lambda f: f.write(train_state)))
    files: list[FileSpec] = []
    if group.rank == 0 and not cfg.save_weights_only:
        config_json, metadata_json = internals.serialize_model_as_json(model)
        files = [
            FileSpec(CONFIG_FILE, lambda f: f.write(config_json.encode())),
            FileSpec(METADATA_FILE, lambda f: f.write(metadata_json.encode())),
        ]

    def parts(work: str) -> None:
        write_part(work, group.rank, chunks, files=own)

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
    """Every variable of the model is in the checkpoint with its shape and dtype, and nothing else is."""
    saved = {p: info for p, info in reader.variables.items() if not p.startswith("_")}
    problems = [f"{p}: not in the checkpoint" for p in variables if p not in saved]
    problems += [f"{p}: in the checkpoint but not in the model" for p in saved if p not in variables]
    for p, v in variables.items():
        info = saved.get(p)
        if info is None:
            continue
        shape, dtype = tuple(int(n) for n in v.shape), keras.backend.standardize_dtype(v.dtype)
        if tuple(info.global_shape) != shape or info.dtype != np.dtype(_np_dtype(dtype)).name:
            problems.append(f"{p}: checkpoint {info.dtype}{list(info.global_shape)} != model {dtype}{list(shape)}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ModelMismatch(f"checkpoint {where} does not match the model: {shown}; nothing was loaded")


def _np_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return ml_dtypes.bfloat16
    return name


def read_sharded(model: Any, where: str) -> dict[str, tuple[Any, Any]]:
    """Every variable's slices of this process, as ``(variable, array in its current sharding)``; nothing assigned.

    ``model``: a model, or ``{path: variable}``.

    Raises:
        ModelMismatch: the checkpoint's variables, shapes or dtypes differ from the model's.
    """
    import jax  # noqa: PLC0415 (this module is imported by one-process jobs too)

    variables = variables_of(model)
    arrays = {}
    with ShardedReader(where) as reader:
        if not set(variables) <= set(reader.variables):
            variables = _by_position(variables, reader) or variables
        _check(variables, reader, where)
        for path, v in variables.items():
            sharding = getattr(v.value, "sharding", None)
            shape = tuple(int(n) for n in v.shape)

            def read(index: Any, path: str = path) -> np.ndarray:
                return reader.read(path, index)

            value = read(None) if sharding is None else jax.make_array_from_callback(shape, sharding, read)
            arrays[path] = (v, value)
    return arrays


def assign_all(arrays: dict[str, tuple[Any, Any]]) -> None:
    """Assign what :func:`read_sharded` read."""
    for v, value in arrays.values():
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
) -> Pending:
    """Load a sharded checkpoint into ``model`` on process ``rank``; return the state to apply when fit starts.

    ``agree(ok)`` (a multi-process restore) is called once every slice is read: True iff every
    process read its slices. Only then is anything assigned, on every process or on none.

    Raises:
        ModelMismatch: the checkpoint does not match the model (nothing is assigned anywhere).
        NoValidCheckpoint: another process could not read its slices (nothing is assigned).
    """
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"{where} is a sharded (multi-process) checkpoint, whose optimizer state is stored like the "
            "weights: call model.compile(...) before restart()"
        )
    assign_all(read_all_or_none(lambda: read_sharded(model, where), where, agree))
    data = contents.get(train_state_part(rank))
    if data is None:
        log.warning(
            f"restart: {where} holds no training state for process {rank} (it was written by fewer "
            "processes): this process's RNG and input position start fresh"
        )
        return Pending()
    return Pending(train_state=bytes(data))


def files_to_read(model: Any, where: str, rank: int) -> set[str]:
    """The files of the sharded checkpoint ``where`` that process ``rank`` reads: the manifest, its training
    state, and the parts holding a chunk of one of its slices (their ``.bin`` and ``.json``).

    Raises:
        CheckpointError: the manifest cannot be read (the verification then fails, naming it).
    """
    variables = variables_of(model)
    needed = {MANIFEST, train_state_part(rank)}
    with ShardedReader(where) as reader:
        if not set(variables) <= set(reader.variables):
            variables = _by_position(variables, reader) or variables
        ranks: set[int] = set()
        for path, v in variables.items():
            if path not in reader.variables:
                return needed | {p for r in range(reader.process_count) for p in (part_bin(r), part_index(r))}
            # The sharding's map, not addressable_shards: with one device per process, a variable Keras has just
            # placed (JAX 0.10.2) cannot list its shards ("... input arrays must have one shard each").
            sharding = getattr(v.value, "sharding", None)
            mapped = sharding.addressable_devices_indices_map(tuple(v.value.shape)) if sharding is not None else {}
            for index in list(mapped.values()) or [None]:
                ranks |= reader.parts_for(path, index)
    return needed | {name for r in ranks for name in (part_bin(r), part_index(r))}
