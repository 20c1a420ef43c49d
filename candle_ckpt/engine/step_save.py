"""A step (mid-epoch) checkpoint: saved now, synchronously, with the full commit protocol (no Keras here).

Used for a preemption save and for ``ckpt_save_steps``. The epoch
checkpoints' order is kept: the write in flight (async mode) is joined and
its error surfaced first, then the snapshot is taken on this thread and
committed here into ``ckpts/steps/GGG`` (see :mod:`candle_ckpt.storage.steps`),
so the checkpoint is durable when :func:`save_step` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from candle_ckpt.core import layout as L
from candle_ckpt.core.log import human_bytes
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.engine.aftercommit import save_record
from candle_ckpt.engine.group_commit import commit_step


def save_step(
    engine: Any, epoch: int, step: int, logs: Mapping[str, Any], capture: Callable[[], Any], reason: str
) -> Sidecar | None:
    """Commit the step checkpoint of ``step`` steps into the epoch after ``epoch`` (completed epochs).

    Args:
        engine: The job's :class:`~candle_ckpt.engine.engine.CheckpointEngine`.
        epoch: Completed epochs (the sidecar's ``epoch``, as ``initial_epoch`` takes it).
        step: Training steps done in the current epoch (the sidecar's ``step``).
        logs: The latest batch logs (kept in the sidecar; best tracking is not touched).
        capture: Returns the :class:`~candle_ckpt.engine.engine.Capture` (called on this thread).
        reason: Recorded in the sidecar: ``"SIGTERM"``, ``"deadline"``, ``"steps"``...

    Returns:
        The committed sidecar (on every process of a multi-process JAX
        job), or None when nothing was committed: a non-chief worker (it
        writes its scratch copy only) or a failure under ``ckpt_on_error=warn``.

    Raises:
        CheckpointSaveError: the save (or the previous async one) failed and ``ckpt_on_error=raise``.
    """
    engine._check_writer()
    try:
        engine.writer.wait()  # the write in flight commits first: generations stay in commit order
    except TimeoutError as err:
        engine._failed(epoch, err)
        return None
    engine._check_writer()
    try:
        cap = engine._capture(capture)
        template = replace(engine.template(epoch, cap, logs, reason, engine.policy.best), step=step)
        if engine.scratch_dir is not None:
            engine._write_scratch(epoch, cap)
            return None
        if engine.group is not None:  # every rank writes its part; the primary commits
            side = commit_step(engine.store, engine.group, cap, template)
        else:
            side = engine.store.steps.commit(cap.files, template)
    except Exception as err:
        engine._failed(epoch, err)
        return None
    engine.records.append(save_record({"epoch": epoch, "step": step, "reason": reason}, cap, side))
    engine.ops.info(
        f"epoch {epoch + 1} step {step}: saved steps/{L.epoch_name(side.generation)} ({reason}) "
        f"{human_bytes(side.total_bytes)} in {side.save_duration_s:.3f} s ({side.save_mb_per_s:.1f} MB/s)"
    )
    return side
