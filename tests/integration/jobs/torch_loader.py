"""A torch ``DataLoader`` feeding ``fit`` on any backend (Keras 3 takes one as it takes a ``PyDataset``), for
``exact_job.py``'s setup ``torch_loader``: its ``RandomSampler`` draws each epoch's order from torch's global
generator, which Keras's ``set_random_seed`` seeds on the torch backend only, so the job seeds it too."""

from __future__ import annotations

import numpy as np
import torch


def seed(value: int) -> None:
    """Seed torch's global generator, as the job seeds everything else."""
    torch.manual_seed(value)


def loader(x: np.ndarray, y: np.ndarray, batch: int) -> torch.utils.data.DataLoader:
    """``(x, y)`` in shuffled batches of ``batch``."""
    pairs = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    return torch.utils.data.DataLoader(pairs, batch_size=batch, shuffle=True)
