"""Framework-neutral checkpointing: the types adapters implement (``Capture``), the sync /
async writer, the engine (policy + snapshot + commit) and resume (which checkpoint,
verify, load through an adapter). Imports no keras.
"""
