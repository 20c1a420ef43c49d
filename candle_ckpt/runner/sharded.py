"""A :class:`~candle_ckpt.runner.job.JobRunner` checkpoint written by every process of a multi-process JAX job.

The same format as the callback's sharded checkpoint (:mod:`candle_ckpt.multihost.save`):
every variable of every registered object is named ``<object name>/<variable.path>``
(a Keras variable or seed generator of ``state``: ``loop_state/<key>``), and each
process writes only the shards it holds with ``replica_id == 0`` into its part.
The rest of the loop state (JSON values, NumPy generators and arrays) is each
process's own: ``loop_state.pRRRRR.json`` and ``loop_state.pRRRRR.npz`` in its
part, so every process gets its own RNG states and positions back.

Restore reads each process's slices into the variables' current shardings,
and assigns only once every process has read its slices (all or none); a
process with no loop state of its own in the checkpoint (it was written by
fewer processes) takes the primary's, and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from candle_ckpt.core.errors import NoValidCheckpoint
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.engine.capture import Capture
from candle_ckpt.keras.preflight import build_optimizer
from candle_ckpt.keras.state import KERAS_VERSION, backend_name
from candle_ckpt.multihost.load import assign_all, files_to_read, read_all_or_none, read_sharded
from candle_ckpt.multihost.save import ORDER, capture_chunks, state_variables
from candle_ckpt.runner.state import (
    STATE_JSON,
    STATE_NPZ,
    RunnerObject,
    apply_loop_state,
    loop_state_files,
    read_loop_state,
    state_variable,
)
from candle_ckpt.storage.sharded import MANIFEST, write_part
from candle_ckpt.storage.store import FileSpec


def loop_state_parts(rank: int) -> tuple[str, str]:
    """Process ``rank``'s loop-state files: ``loop_state.p00001.json`` and ``loop_state.p00001.npz``."""
    return f"loop_state.p{rank:05d}.json", f"loop_state.p{rank:05d}.npz"


def reads(rank: int) -> tuple[str, ...]:
    """The files process ``rank`` loads on restore: its loop state and, in case it has none, the primary's."""
    return tuple(dict.fromkeys((*loop_state_parts(rank), *loop_state_parts(0))))


def runner_variables(objects: list[RunnerObject], state: Mapping[str, Any], kinds: Mapping[str, str]) -> dict:
    """Every variable the runner checkpoints, by its name in the manifest (see the module docstring)."""
    found: dict[str, Any] = {}
    for o in objects:
        o.ensure_built()
        build_optimizer(o.obj)  # a model's own optimizer, in its strategy's scope
        for path, v in state_variables(o.obj).items():
            found[f"{o.name}/{path}"] = v
    for key, value in state.items():
        if kinds.get(key) == "keras":
            found[f"loop_state/{key}"] = state_variable(value)
    return found


def _plain(state: Mapping[str, Any], kinds: Mapping[str, str]) -> dict[str, Any]:
    """The loop state each process keeps for itself: all but Keras variables (those are sharded)."""
    return {k: v for k, v in state.items() if kinds.get(k) != "keras"}


def capture_runner_sharded(
    objects: list[RunnerObject],
    state: Mapping[str, Any],
    kinds: Mapping[str, str],
    epoch: int,
    step: int | None,
    group: Group,
    copy: bool,
) -> Capture:
    """This process's part of a runner checkpoint: its shards and its own loop state (on the training thread)."""
    start = time.perf_counter()
    chunks, sharding = capture_chunks(runner_variables(objects, state, kinds), group, copy=copy)
    names = dict(zip((STATE_JSON, STATE_NPZ), loop_state_parts(group.rank), strict=True))
    own = [FileSpec(names[f.name], f.write) for f in loop_state_files(_plain(state, kinds), kinds, epoch, step)]

    def parts(work: str) -> None:
        write_part(work, group.rank, chunks, files=own)

    return Capture(
        files=[],
        model_file=MANIFEST,
        nbytes=sum(c.data.nbytes for c in chunks),
        snapshot_s=time.perf_counter() - start,
        keras_version=KERAS_VERSION,
        backend=backend_name(),
        extra={"runner": {"objects": {o.name: o.name + "/" for o in objects}, "state": sorted(state)}},
        parts=parts,
        sharding=sharding,
        manifest_extra={ORDER: list(sharding)},
    )


def files_for(objects: list[RunnerObject], state: Mapping[str, Any], kinds: Mapping[str, str], rank: int):
    """``needed(where)`` of :func:`~candle_ckpt.engine.group_restore.agree_on_checkpoint`: the files rank reads."""

    def needed(where: str) -> set[str]:
        return files_to_read(runner_variables(objects, state, kinds), where, rank) | set(reads(rank))

    return needed


def _own_state(contents: Mapping[str, Any], group: Group, where: str, log: Any) -> dict[str, bytes]:
    """This process's loop-state files (as ``loop_state.json`` / ``.npz``), or the primary's with a warning."""
    rank = group.rank
    json_name, npz_name = loop_state_parts(rank)
    if json_name not in contents:
        if is_primary(group) or loop_state_parts(0)[0] not in contents:
            raise NoValidCheckpoint(
                f"checkpoint {where} has no loop state ({json_name}); was it written by a JobRunner?"
            )
        log.warning(
            f"restart: {where} holds no loop state for process {rank} (it was written by fewer processes): "
            "this process continues with process 0's loop state (its RNG states and positions)"
        )
        json_name, npz_name = loop_state_parts(0)
    own = {STATE_JSON: bytes(contents[json_name])}
    if npz_name in contents:
        own[STATE_NPZ] = bytes(contents[npz_name])
    return own


def restore_runner_sharded(
    objects: list[RunnerObject],
    state: MutableMapping[str, Any],
    kinds: Mapping[str, str],
    chosen: Any,
    log: Any,
    where: str,
    group: Group,
    agree: Callable[[bool], bool] | None,
) -> tuple[int, int] | None:
    """Load a sharded runner checkpoint on this process of ``group``; return (epoch, step) of a mid-epoch one.

    ``agree(ok)`` (several processes): True iff every process read its slices and its loop
    state. Only then is anything assigned, on every process or on none.

    Raises:
        ModelMismatch: the checkpoint's variables differ from the objects' (nothing assigned anywhere).
        NoValidCheckpoint: this or another process could not read its part (nothing assigned).
    """

    def read() -> tuple[dict, dict, dict]:
        own = _own_state(chosen.contents, group, where, log)
        doc = read_loop_state(_plain(state, kinds), own, where)
        return own, doc, read_sharded(runner_variables(objects, state, kinds), where, chosen.contents)

    own, doc, arrays = read_all_or_none(read, where, agree)
    assign_all(arrays)
    apply_loop_state(state, doc, own)
    return (doc["epoch"], doc["step"]) if "step" in doc else None
