"""Keras 3's callbacks under the one rule of :mod:`candle_ckpt.engine.state_file` (see there)."""

from __future__ import annotations

import keras

from candle_ckpt.engine.state_file import CallbackRule, has_protocol

RULE = CallbackRule(keras.callbacks)
unsaved, capture, restore = RULE.unsaved, RULE.capture, RULE.restore

__all__ = ["RULE", "capture", "has_protocol", "restore", "unsaved"]
