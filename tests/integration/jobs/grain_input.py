"""A grain dataset feeding ``fit`` (Keras 3 takes a ``MapDataset``, an ``IterDataset`` or a ``DataLoader``), for
``exact_job.py``'s setups ``grain_map`` (one seeded shuffle, read afresh each epoch: the same order every epoch)
and ``grain_repeat`` (reshuffled each epoch by ``repeat()``; one iterator that Keras keeps across epochs, with
``steps_per_epoch``)."""

from __future__ import annotations

import grain
import numpy as np


def fit_inputs(x: np.ndarray, y: np.ndarray, batch: int, setup: str) -> dict:
    """``fit``'s keyword arguments for ``setup``: ``(x, y)`` shuffled with seed 7, in batches of ``batch``."""
    ds = grain.MapDataset.source([(x[i], y[i]) for i in range(len(x))]).shuffle(seed=7)
    if setup == "grain_repeat":
        return {"x": ds.repeat(None).batch(batch).to_iter_dataset(), "steps_per_epoch": len(x) // batch}
    return {"x": ds.batch(batch)}
