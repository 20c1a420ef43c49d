"""What an adapter hands the engine for one save: :class:`Capture`.

An adapter's ``capture()`` returns a :class:`Capture` on the training thread;
the engine (:mod:`candle_ckpt.engine.engine`) makes the sidecar of it and
commits its files (on the writer's thread in async mode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.storage.store import FileSpec


@dataclass
class Capture:
    """What an adapter captured on the training thread for one save."""

    files: list[FileSpec]
    model_file: str
    nbytes: int
    snapshot_s: float = 0.0
    keras_version: str | None = None
    backend: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # A multi-process save: parts(work_dir) writes this process's part; ``files`` are the primary's own.
    parts: Callable[[str], Any] | None = None
    sharding: dict[str, str] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)  # kept in a sharded checkpoint's manifest
    # Set when an asynchronous save could not copy the state (it would not fit in host memory): the files write
    # from the live variables, so the engine commits this one before training goes on, and says why, once.
    inline_why: str | None = None
