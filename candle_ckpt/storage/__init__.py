"""A checkpoint directory on disk: the writer lock, the commit protocol, list / verify /
prune / rollback (store) and the remote mirror (remote). Built on :mod:`candle_ckpt.core`.
"""
