"""Checkpoint parameters: the schema of every ``ckpt_*`` key, coercion, ``ckpt_parser`` /
``ckpt_defs`` and the frozen :class:`~candle_ckpt.config.params.CkptConfig`. Depends on the
standard library only.
"""
