"""A Keras 3 model's share of a multi-process JAX save: each process captures the slices it writes.

For every model and optimizer variable, the slices :func:`~candle_ckpt.multihost.replicas.state_plan` gives this
process. The processes holding a block split it between them, so every value
is written exactly once across the job and, under DataParallel (every process
holds everything), each process writes about ``1/N`` of the state. They become
this process's part (:func:`~candle_ckpt.storage.sharded.write_part`), with its
training state ``train.state.pRRRRR.npz``; the primary adds the model's Keras
config (``config.json``, ``metadata.json``, as in a ``.keras`` archive).
Variables are named by their Keras ``variable.path`` (docs/format.rst).
Reading the share back is :mod:`candle_ckpt.multihost.load`.

This room reaches Keras through its public API only: what needs Keras's
internals (the model's JSON, building an optimizer under a ``tf.distribute``
scope) is done by the caller in keras/ or runner/ and handed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.distributed.jax_group import jax_group
from candle_ckpt.engine.capture import Capture
from candle_ckpt.multihost.replicas import is_global, local, local_blocks, state_plan
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.sharded import MANIFEST, Chunk, Index, write_part
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
    """The model's and its optimizer's variables by ``variable.path``.

    The caller builds the optimizer first (:func:`~candle_ckpt.keras.preflight.build_optimizer`, which knows
    the ``tf.distribute`` scope an optimizer was made under): an unbuilt one has no variables to list.

    Raises:
        ValueError: two different variables share a path (the checkpoint could not tell them apart).
    """
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
    model: Any, group: Group, copy: bool, spare: SpareChunks | None = None
) -> tuple[list[Chunk], dict[str, str]]:
    """This process's chunks of every variable of ``model`` (or of ``{path: variable}``), and their shardings.

    Of a JAX array, the slices :func:`state_plan` gives this process (``group.rank``); of a host value, the
    whole, on the primary. ``copy``: owned copies (an async save), in ``spare``'s buffers where they are free.
    """
    rank = group.rank
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
            if is_primary(group):
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
    model: Any,
    cfg: CkptConfig,
    group: Group,
    train_state: bytes | None,
    spare: SpareChunks | None,
    describe: Callable[[Any], tuple[str, str]],
) -> Capture:
    """The capture of a multi-process save: this process's part (and, on the primary, the model's config).

    ``model``'s optimizer is built (:func:`state_variables`); ``describe(model)`` gives the model's
    ``config.json`` and ``metadata.json`` (keras/'s gateway serializes them), asked on the primary only.
    """
    start = time.perf_counter()
    copy = bool(cfg.async_save)
    chunks, sharding = capture_chunks(model, group, copy=copy, spare=spare)
    own: list[FileSpec] = []
    if train_state is not None:
        own.append(FileSpec(train_state_part(group.rank), lambda f: f.write(train_state)))
    files: list[FileSpec] = []
    if is_primary(group) and not cfg.save_weights_only:
        config_json, metadata_json = describe(model)
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
        keras_version=keras.__version__,
        backend=keras.backend.backend(),
        parts=parts,
        sharding=sharding,
        manifest_extra={ORDER: list(sharding)},
    )
