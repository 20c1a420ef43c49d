"""Every exception candle_ckpt raises about checkpoints, in one place.

Users catch :class:`CheckpointError` for all of them; the subclasses say what
went wrong. Import them from here or from ``candle_ckpt``. Those about a value
that does not fit (a checkpoint and a model, a directory and a layout, a
sidecar's contents) are also :class:`ValueError`, as they were before there
was a hierarchy. (Bad arguments are plain ``ValueError``/``TypeError``, naming
the parameter; :class:`MissingDependency` is an ``ImportError``.)
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class of the errors this library raises about checkpoints."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint failed validation; ``path`` and ``reason`` say why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class NoValidCheckpoint(CheckpointError):
    """No checkpoint could be restored (``required`` mode or an explicit epoch)."""


class DirectoryLocked(CheckpointError):
    """Another live process is writing to this checkpoint directory."""


class ModelMismatch(CheckpointError, ValueError):
    """A checkpoint does not fit the model (layers, shapes, dtypes or variable counts); nothing was assigned.

    Raised by ``restart()``, by the callback when it applies an optimizer state
    restored before ``compile()``, and by ``load_weights``, for our checkpoints,
    tf_keras ones and CANDLE's own ``model.h5``.
    """


class LayoutMismatch(CheckpointError, ValueError):
    """``ckpt_directory`` holds checkpoints in the other layout (nested or flat); the two are never mixed."""


class CheckpointSaveError(CheckpointError):
    """A save failed; earlier checkpoints are intact (``ckpt_on_error=raise``)."""


class CheckpointUploadError(CheckpointError):
    """Draining a checkpoint to the persistent tier (``ckpt_persistent_url``) failed (``ckpt_on_error=raise``)."""


class LineageConflict(CheckpointError):
    """The persistent tier holds checkpoints of another lineage, or a newer copy of this one: the drain refuses."""


class SidecarError(CheckpointError, ValueError):
    """A sidecar that is missing, unreadable, malformed or unsafe (a store reports it as :class:`CorruptCheckpoint`)."""


class MissingDependency(ImportError):
    """An optional dependency is not installed; the message names the pip command that installs it."""


class GroupTimeout(CheckpointError):
    """A process of a multi-process job did not reach a meeting point in time (it died or hangs).

    ``name`` is the meeting point (e.g. ``"save/3/parts-written"``), ``timeout_s``
    how long this process waited, and ``missing`` the ranks that never came
    (empty where the group cannot tell).
    """

    def __init__(self, name: str, timeout_s: float, missing: tuple[int, ...] = ()) -> None:
        who = f" (rank(s) {', '.join(map(str, missing))} never came)" if missing else ""
        super().__init__(f"the processes did not all reach {name!r} within {timeout_s:g} s{who}")
        self.name = name
        self.timeout_s = timeout_s
        self.missing = missing
