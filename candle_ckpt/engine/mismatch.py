"""The error a restore raises when a checkpoint does not fit the model, as every front end words it.

A header naming the checkpoint, the first :data:`SHOWN` differing variables (:class:`Diff`), and what to do; the
model is left unchanged. Framework-free: the Keras 3 adapter finds the differences (``keras/preflight.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from candle_ckpt.core.errors import ModelMismatch
from candle_ckpt.engine.phases import ONLY_OPTIMIZER

# How many differing variables an error names (the rest are counted).
SHOWN = 3
WHAT_TO_DO = (
    "The model was not changed. Build the model this checkpoint was saved from, point ckpt_directory "
    "at this model's own checkpoints, or set ckpt_restart_mode=off to start from scratch."
)


@dataclass(frozen=True)
class Diff:
    """One variable that differs between checkpoint and model."""

    where: str
    saved: str
    model: str

    def __str__(self) -> str:
        return f"{self.where}: saved {self.saved}, model {self.model}"


def shape_text(shape: Any) -> str:
    """A shape as the errors print it: ``(3, 4)``."""
    return str(tuple(int(d) for d in shape))


def mismatch(header: str, diffs: list[Diff], advice: str, compared: int | None = None) -> ModelMismatch:
    """``header``, the first differences (with ``compared``, how many more of how many), then ``advice``."""
    lines = [header, *(f"  {d}" for d in diffs[:SHOWN])]
    if compared is not None and len(diffs) > SHOWN:
        lines.append(f"  ... and {len(diffs) - SHOWN} more ({compared} variables compared)")
    return ModelMismatch("\n".join([*lines, advice]))


def model_mismatch(where: str, epoch: int, diffs: list[Diff], compared: int) -> ModelMismatch:
    """A checkpoint that does not fit the model: its epoch, the first differing variables, what to do."""
    advice = ONLY_OPTIMIZER if all(d.where.startswith("optimizer") for d in diffs) else WHAT_TO_DO
    header = f"checkpoint {where} (epoch {epoch}) does not match the model: {len(diffs)} difference(s)"
    return mismatch(header, diffs, advice, compared)
