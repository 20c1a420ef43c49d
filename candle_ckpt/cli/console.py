"""Console hygiene for the demo and the CLI: TensorFlow's start-up lines, Ctrl-C."""

from __future__ import annotations

import os
import sys
import tempfile
from types import ModuleType

from candle_ckpt.storage.store import CheckpointStore


def import_keras_quietly() -> ModuleType:
    """Import keras (and TensorFlow) without TensorFlow's C++ start-up lines.

    TensorFlow 2.21 prints its oneDNN / CUDA / CPU-feature lines on file
    descriptor 2 while it loads, whatever ``TF_CPP_MIN_LOG_LEVEL`` says at that
    point, so stderr is pointed at a temporary file for the import. If the
    import fails, what was written there is shown. A user who asks for TF's
    logs (``TF_CPP_MIN_LOG_LEVEL`` of 0, 1 or 2) sees them.
    """
    if "keras" in sys.modules:
        return sys.modules["keras"]
    level = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if level in ("0", "1", "2"):
        import keras

        return keras
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as hidden:
        os.dup2(hidden.fileno(), 2)
        try:
            import keras
        except Exception:  # show why the import failed (Ctrl-C during it needs no TF noise)
            os.dup2(saved, 2)
            hidden.seek(0)
            sys.stderr.write(hidden.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return keras


def saved_so_far(directory: str) -> str:
    """What a stopped job leaves behind, in words: the epoch ``last`` points to, and where."""
    store = CheckpointStore(directory)
    last = store.link_epoch("last") if store.exists() else None
    root = store.layout.root
    if last is None:
        return f"no checkpoint was saved yet in {root}"
    return f"the last checkpoint is epoch {last} in {root}"
