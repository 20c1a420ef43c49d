"""Sharded checkpoints made by ranks that are threads (``ThreadGroup``), for the storage, crash and CLI tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.group import Group
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.multipart import RankPart, SharedSave, write_rank_part
from candle_ckpt.storage.sharded import MANIFEST, Chunk
from candle_ckpt.storage.store import CheckpointStore
from candle_ckpt.testing.groups import ThreadGroup


def run_ranks(hub: ThreadGroup, work: Callable[[Group], Any], timeout_s: float = 120.0) -> list[Any]:
    """Run ``work(member)`` for every rank in its own thread; return each result, or the exception it raised."""
    results: list[Any] = [None] * hub.size

    def run(member: Group) -> None:
        try:
            results[member.rank] = work(member)
        except BaseException as err:  # handed back to the test, which asserts on it
            results[member.rank] = err

    threads = [threading.Thread(target=run, args=(m,), daemon=True) for m in hub.members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if any(t.is_alive() for t in threads):
        raise AssertionError(f"a rank did not finish within {timeout_s} s")
    return results


def state_for(epoch: int) -> dict[str, np.ndarray]:
    """The arrays of a small model after ``epoch`` (distinct values per epoch)."""
    rng = np.random.default_rng(epoch)
    return {
        "dense/kernel": rng.standard_normal((6, 4)).astype(np.float32),
        "dense/bias": rng.standard_normal(4).astype(np.float32),
        "adam/iteration": np.array(epoch * 10, np.int64),
    }


def rank_part(arrays: dict[str, np.ndarray], rank: int, size: int) -> RankPart:
    """Rank ``rank``'s share: its block of rows of every array (a scalar belongs to rank 0), plus its train state."""
    chunks = []
    for path, a in arrays.items():
        if a.ndim == 0:
            if rank == 0:
                chunks.append(Chunk(path, a.dtype.name, (), (), a))
            continue
        cuts = np.linspace(0, a.shape[0], size + 1).astype(int)
        start, stop = int(cuts[rank]), int(cuts[rank + 1])
        index = ((start, stop), *((0, n) for n in a.shape[1:]))
        chunks.append(Chunk(path, a.dtype.name, a.shape, index, np.array(a[start:stop], order="C")))
    state = f"rank {rank} state".encode()
    return RankPart(chunks, [FileSpec(f"train.state.p{rank:05d}.npz", lambda f: f.write(state))])


def sidecar_template() -> Sidecar:
    return Sidecar(epoch=0, generation=0, model_file=MANIFEST, files={}, save_best_metric="loss")


def save_sharded(
    directory: str,
    hub: ThreadGroup,
    epoch: int,
    *,
    store: CheckpointStore | None = None,
    fs_for: Callable[[int], LocalFS] | None = None,
    timeout_s: float = 60.0,
    step: int | None = None,
) -> list[Any]:
    """Every rank of ``hub`` saves epoch ``epoch`` (or a step checkpoint) of :func:`state_for` together.

    Rank 0 commits through ``store`` (opened for writing, or a new one), the
    others through ``write_rank_part``. Returns each rank's result or exception.
    """
    arrays = state_for(epoch)
    own = store or CheckpointStore(directory, fs=fs_for(0) if fs_for else None)
    own.open_for_write()
    key = f"save/{epoch}/{step}"

    def work(g: Group) -> Any:
        part = rank_part(arrays, g.rank, g.size)
        if g.rank == 0:
            shared = SharedSave(g, key, part, {p: f"rows over {g.size}" for p in arrays}, timeout_s=timeout_s)
            files = [FileSpec("config.json", lambda f: f.write(b"{}"))]
            side = sidecar_template()
            if step is not None:
                return own.steps.commit(files, replace(side, epoch=epoch, step=step), shared=shared)
            return own.commit(epoch, files, side, best_epoch=epoch, shared=shared)
        fs = fs_for(g.rank) if fs_for else None
        return write_rank_part(own.layout, g, key, part, fs=fs, timeout_s=timeout_s)

    try:
        return run_ranks(hub, work, timeout_s * 4)
    finally:
        if store is None:
            own.close()
