"""A Keras 3 job on JAX for the compilation-cache tests: restart(), the callback, fit with validation.

Usage::

    KERAS_BACKEND=jax python compile_cache_job.py DIR EPOCHS [ckpt_KEY=VALUE ...] [--own-cache PATH]

Trains a small Dense model with Adam to EPOCHS (resuming from DIR), then prints one line ``RESULT {json}``:
JAX's cache directory, the modules JAX found in its persistent cache (its own log line for each hit), the
count of its ``cache_hits`` events, and whether TensorFlow was imported. ``--own-cache PATH`` sets
``jax_compilation_cache_dir`` before anything of ours runs, as a job with its own cache would.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.monitoring  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import candle_ckpt  # noqa: E402

HITS: list[str] = []
EVENTS: dict[str, int] = {}


class HitLog(logging.Handler):
    """Collects the module names of JAX's "Persistent compilation cache hit for 'NAME'" lines."""

    def emit(self, record: logging.LogRecord) -> None:
        found = re.match(r"Persistent compilation cache hit for '([^']+)'", record.getMessage())
        if found:
            HITS.append(found.group(1))


def main(argv: list[str]) -> None:
    directory, epochs = argv[0], int(argv[1])
    rest = argv[2:]
    if "--own-cache" in rest:
        at = rest.index("--own-cache")
        jax.config.update("jax_compilation_cache_dir", rest[at + 1])
        del rest[at : at + 2]
    compiler_log = logging.getLogger("jax._src.compiler")
    compiler_log.setLevel(logging.DEBUG)
    compiler_log.addHandler(HitLog())
    jax.monitoring.register_event_listener(lambda event, **kw: EVENTS.__setitem__(event, EVENTS.get(event, 0) + 1))
    params = {"ckpt_directory": directory, "epochs": epochs}
    params.update(arg.split("=", 1) for arg in rest)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = x @ rng.normal(size=(8, 1)).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    info = candle_ckpt.restart(params, model, verbose=False)
    ckpt = candle_ckpt.CandleCheckpointCallback(params, verbose=False)
    model.fit(x, y, validation_split=0.25, epochs=epochs, initial_epoch=info["epoch"] if info else 0, callbacks=[ckpt])
    result = {
        "cache_dir": jax.config.jax_compilation_cache_dir,
        "min_compile_secs": jax.config.jax_persistent_cache_min_compile_time_secs,
        "hits": HITS,
        "hit_events": EVENTS.get("/jax/compilation_cache/cache_hits", 0),
        "tensorflow_loaded": "tensorflow" in sys.modules,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
