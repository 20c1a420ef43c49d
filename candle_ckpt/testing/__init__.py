"""Test helpers for code that writes checkpoints (no keras import).

:mod:`candle_ckpt.testing.crashsim` records every file-system operation of a
save and rebuilds what a power cut at any point would leave on disk.
"""
