"""Build a :class:`~candle_ckpt.engine.engine.Capture` from a Keras model's host snapshot."""

from __future__ import annotations

import os
import time

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import NoValidCheckpoint
from candle_ckpt.engine.engine import Capture
from candle_ckpt.keras.preflight import check_model, read_optimizer_state
from candle_ckpt.keras.state import KERAS_VERSION, ModelState, backend_name, build_optimizer, write_keras_archive
from candle_ckpt.keras.train_state import TRAIN_STATE_FILE
from candle_ckpt.storage.store import FileSpec


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

    keep_files = (L.WEIGHTS_FILE, L.EXTRA_FILE, TRAIN_STATE_FILE)

    def __init__(self, model) -> None:
        self.state = ModelState(model)
        # State restore() could not apply yet (see candle_ckpt.engine.resume.Resumed.pending).
        self.pending: dict = {}

    def capture(self, cfg: CkptConfig) -> Capture:
        return capture_model(self.state, cfg)

    def restore(self, chosen, ops, where: str) -> None:
        """Load a verified checkpoint (a :class:`~candle_ckpt.engine.resume.Chosen`) into the model.

        Raises:
            NoValidCheckpoint: the checkpoint has no Keras 3 weights file.
        """
        side, kept = chosen.sidecar, chosen.kept
        if side.model_file not in kept:
            raise NoValidCheckpoint(f"checkpoint {where} has no {L.WEIGHTS_FILE}")
        model = self.state.model
        build_optimizer(model)  # raises if the model is not built
        extra = kept.get(L.EXTRA_FILE)
        extra_vars = self.state.extra_variables()
        # All or nothing: every shape, dtype and count is checked before the first assignment.
        check_model(model, kept[side.model_file], extra, extra_vars, where, side.epoch)
        self.pending = {}
        if getattr(model, "optimizer", None) is None:
            # restart() before compile(): the optimizer does not exist yet. Its state
            # is kept and applied when it does (the callback, at the latest when fit starts).
            arrays = read_optimizer_state(kept[side.model_file])
            if arrays is not None:
                self.pending["optimizer"] = arrays
        self.state.restore(kept[side.model_file])
        if extra is not None:
            self.state.restore_extra(bytes(extra))
        elif extra_vars:
            ops.warning(
                f"restart: {where} has no {L.EXTRA_FILE}; the random-layer seed states "
                "start fresh, so the resumed run will not be bit-identical"
            )
        if TRAIN_STATE_FILE in kept:
            self.pending["train_state"] = bytes(kept[TRAIN_STATE_FILE])
