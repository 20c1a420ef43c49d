"""Build a :class:`~candle_ckpt.engine.Capture` from a Keras model's host snapshot."""

from __future__ import annotations

import os
import time

from candle_ckpt import layout as L
from candle_ckpt.engine import Capture
from candle_ckpt.keras_state import KERAS_VERSION, ModelState, backend_name, write_keras_archive
from candle_ckpt.params import CkptConfig
from candle_ckpt.store import FileSpec


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
