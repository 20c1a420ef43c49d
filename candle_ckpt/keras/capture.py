"""Build a :class:`~candle_ckpt.engine.engine.Capture` from a Keras model's host snapshot."""

from __future__ import annotations

import os
import time

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.candle_sidecar import CandleSidecar
from candle_ckpt.engine.engine import Capture
from candle_ckpt.keras.argcheck import require_model
from candle_ckpt.keras.candle_h5 import keep_pending, restore_candle_h5
from candle_ckpt.keras.state import KERAS_VERSION, ModelState, backend_name, write_keras_archive
from candle_ckpt.storage.store import FileSpec, NoValidCheckpoint


def capture_model(state: ModelState, cfg: CkptConfig, extra: dict | None = None) -> Capture:
    """Snapshot ``state`` on this thread; the returned files write from the snapshot.

    Async saves copy the state (training goes on during the write); sync
    saves write straight from the variables, which no step can change before
    the write is done, so they copy nothing.
    """
    start = time.perf_counter()
    snap = state.snapshot(copy=cfg.async_save)
    files = [FileSpec(L.WEIGHTS_FILE, snap.write_h5)]
    if snap.extra:
        files.append(FileSpec(L.EXTRA_FILE, snap.write_extra))
    if not cfg.save_weights_only:
        config_json, metadata_json = state.full_model_parts()

        def write_archive(f) -> None:
            weights = os.path.join(os.path.dirname(f.path), L.WEIGHTS_FILE)
            write_keras_archive(f, config_json, metadata_json, weights)

        files.append(FileSpec(L.MODEL_FILE, write_archive))
    return Capture(
        files=files,
        model_file=L.WEIGHTS_FILE,
        nbytes=snap.nbytes,
        snapshot_s=time.perf_counter() - start,
        keras_version=KERAS_VERSION,
        backend=backend_name(),
        extra=dict(extra or {}),
    )


class KerasModelAdapter:
    """Capture and restore one Keras 3 model (a :class:`~candle_ckpt.engine.resume.Adapter`):
    used by ``restart()`` and :class:`~candle_ckpt.distributed.worker_state.WorkerTrainingState`."""

    keep_files = (L.WEIGHTS_FILE, L.EXTRA_FILE)

    def __init__(self, model) -> None:
        require_model(model, "model")
        self.state = ModelState(model)

    def capture(self, cfg: CkptConfig) -> Capture:
        return capture_model(self.state, cfg)

    def restore(self, chosen, ops, where: str) -> None:
        """Load a verified checkpoint (a :class:`~candle_ckpt.engine.resume.Chosen`) into the model.

        Raises:
            NoValidCheckpoint: the checkpoint has no Keras 3 weights file.
        """
        side, kept = chosen.sidecar, chosen.kept
        if isinstance(side, CandleSidecar):  # written by ECP-CANDLE itself: its model.h5
            pending = restore_candle_h5(self.state.model, os.path.join(where, side.model_file), ops, where)
            if pending is not None:  # not compiled yet: the callback applies it when fit begins
                keep_pending(self.state.model, pending, where)
            return
        if side.model_file not in kept:
            raise NoValidCheckpoint(f"checkpoint {where} has no {L.WEIGHTS_FILE}")
        self.state.restore(kept[side.model_file])
        if L.EXTRA_FILE in kept:
            self.state.restore_extra(bytes(kept[L.EXTRA_FILE]))
        elif self.state.extra_variables():
            ops.warning(
                f"restart: {where} has no {L.EXTRA_FILE}; the random-layer seed states "
                "start fresh, so the resumed run will not be bit-identical"
            )
