"""Stand-in for issue 16's step checkpoints (``ckpts/steps/``), for the multi-worker preemption save.

Replace at merge with the engine's step save and the step-aware choice of
``engine/resume.py``; this module keeps the multi-worker path testable until then.

A step checkpoint is committed with the full protocol (``work/``, CRC32s,
sidecar, ``last``) into a store of its own, ``<ckpts>/steps/`` in the flat
layout (``steps/epochs/GGG``, GGG a sequence number), by the chief only; a
non-chief writes its scratch copy as for epoch checkpoints. The sidecar's
``extra["step"]`` is ``{"epoch": E, "step": S}``: S steps done in the epoch
after E completed epochs. Restore prefers it to the epoch checkpoint it
would otherwise load when ``E`` is at least that checkpoint's epoch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from candle_ckpt.core.layout import Layout
from candle_ckpt.core.sidecar import Sidecar, clean_logs
from candle_ckpt.engine.resume import Chosen
from candle_ckpt.storage.store import CheckpointStore

STEPS_DIR = "steps"


def step_store(cfg: Any, fs: Any = None) -> CheckpointStore:
    """The store of step checkpoints beside ``epochs/``."""
    root = os.path.join(Layout.at(cfg.directory, flat=cfg.layout == "flat").ckpts, STEPS_DIR)
    return CheckpointStore(root, fs=fs, checksum=cfg.checksum, flat=True)


def position(side: Sidecar) -> tuple[int, int] | None:
    """``(completed epochs, steps done in the next)`` of a step checkpoint's sidecar, else None."""
    at = (side.extra or {}).get("step")
    return (int(at["epoch"]), int(at["step"])) if isinstance(at, dict) else None


def save_step(engine: Any, epoch: int, step: int, logs: dict[str, Any], capture: Callable[[], Any]) -> bool:
    """Save ``step`` steps into the epoch after ``epoch``: the chief commits, a non-chief writes scratch.

    Synchronous: the write in flight is joined first, then this one is written
    on the calling thread (a preemption save must be durable before we stop).
    """
    engine.finish()
    cap = capture()
    if engine.scratch_dir is not None:
        engine._write_scratch(epoch, cap)
        return True
    store = step_store(engine.cfg, engine.store.fs)
    store.open_for_write()
    try:
        number = max(store.epochs(), default=0) + 1
        template = Sidecar(
            epoch=number,
            generation=0,
            model_file=cap.model_file,
            files={},
            save_best_metric=engine.cfg.save_best_metric,
            best_metric_last=engine.best.value,
            best_epoch=engine.best.epoch,
            save_best_mode=engine.mode,
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            time_elapsed=round(engine.time_base + time.time() - engine.start_time, 3),
            metadata=engine.cfg.metadata,
            logs=clean_logs(logs),
            reason="preempt",
            keras_version=cap.keras_version,
            backend=cap.backend,
            extra={**cap.extra, "step": {"epoch": epoch, "step": step}},
        )
        side = store.commit(number, cap.files, template)
    finally:
        store.close()
    engine.ops.info(
        f"step {step} of epoch {epoch + 1}: saved {store.layout.epoch_dir(number)} ({side.total_bytes} bytes "
        f"in {side.save_duration_s:.3f} s)"
    )
    return True


def newest_step(cfg: Any, keep: Iterable[str], after_epoch: int | None) -> Chosen | None:
    """The newest valid step checkpoint if it is newer than epoch checkpoint ``after_epoch`` (None: none)."""
    store = step_store(cfg)
    if not store.exists():
        return None
    found = store.find_valid(keep=tuple(keep))
    if found is None:
        return None
    at = position(found[1])
    if at is None or (after_epoch is not None and at[0] < after_epoch):
        return None
    return Chosen(*found)


def verify_step(cfg: Any, number: int, generation: int, keep: Iterable[str]) -> Chosen:
    """Verify exactly the step checkpoint the chief chose (see ``engine.resume.verify_exact``)."""
    from candle_ckpt.engine.resume import verify_exact

    return verify_exact(step_store(cfg), number, generation, keep)
