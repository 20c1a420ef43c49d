"""One commit across the processes of a job: every rank writes its part, the primary alone publishes.

The order, for one checkpoint and a :class:`~candle_ckpt.core.group.Group` ``g``
(``key`` names this save, the same on every rank, e.g. ``"save/7"``):

1. the primary (the writer-lock holder) makes a fresh ``work/`` and says so:
   ``g.broadcast(key/work-ready, "ok" | "error: ...")``;
2. every rank writes and fsyncs its part (``part-RRRRR.bin``, its files such
   as ``train.state.pRRRRR.npz``, then ``part-RRRRR.json``) into that
   ``work/`` without taking the lock;
3. ``g.all_agree(key/parts-written, ok)``: a rank that failed says so at once;
4. the primary checks every part (present, size, CRC32) and writes
   ``manifest.json``, its own files and the sidecar listing every file, fsyncs
   ``work/`` and runs the usual rename and link steps of
   :mod:`candle_ckpt.storage.commit`;
5. ``g.broadcast(key/committed, "epochs/NNN" | "steps/GGG" | "error: ...")``.

Non-primaries never take the lock, rename, link or prune. A failed or missing
part means nothing is published: ``work/`` is discarded and the previous
checkpoint stays what ``restart()`` picks. A process that dies anywhere leaves
``work/`` as debris (removed by the next writer), never a published mix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointSaveError, GroupTimeout
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.core.sidecar import FileEntry
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.sharded import Chunk, write_manifest, write_part

logger = logging.getLogger("candle_ckpt.storage.multipart")

ERROR = "error: "
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RankPart:
    """What one rank writes into ``work/``: the chunks it owns and its own files (``train.state.pRRRRR.npz``)."""

    chunks: Sequence[Chunk]
    files: Sequence[FileSpec] = ()


# A rank's part: the chunks and files to write, or a callable that writes them into the work directory it is
# given (through write_part); a callable that raises (a snapshot that failed) fails the save on every rank.
Part = RankPart | Callable[[str], object]


def _write(part: Part, work: str, rank: int, fs: LocalFS) -> None:
    if callable(part):
        part(work)
    else:
        write_part(work, rank, part.chunks, fs, part.files)


@dataclass
class SharedSave:
    """The primary's side of one multi-part commit; passed to ``CheckpointStore.commit(..., shared=)``.

    Args:
        group: The job's processes (this one must be rank 0).
        key: Names this save's meeting points; the same on every rank and unique in the job.
        part: The primary's own part (a :class:`RankPart`, or a callable writing it into the directory given).
        sharding: A description of each variable's sharding, by path (kept in the manifest).
        extra: Anything else for the manifest.
        timeout_s: How long to wait for the other ranks at each meeting point.
    """

    group: Group
    key: str
    part: Part
    sharding: dict[str, str] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    _stage: str = "start"

    def __post_init__(self) -> None:
        if not is_primary(self.group):
            raise ValueError(f"SharedSave is the primary's (rank 0); this is rank {self.group.rank}")

    def work_ready(self) -> None:
        """Step 1: tell the other ranks that ``work/`` is fresh and theirs to write into."""
        self._stage = "work-ready"
        self.group.broadcast(f"{self.key}/work-ready", "ok", self.timeout_s)

    def gather(self, fs: LocalFS, work: str) -> dict[str, FileEntry]:
        """Steps 2-4: write the primary's part, wait for every rank's, check them all, write the manifest.

        Returns every file of the parts and the manifest, by name, for the sidecar.
        """
        ok, error = True, None
        try:
            _write(self.part, work, 0, fs)
        except Exception as err:  # the others must still hear that this save is off
            ok, error = False, err
        self._stage = "parts-written"
        agreed = self.group.all_agree(f"{self.key}/parts-written", ok, self.timeout_s)
        if error is not None:
            raise error
        if not agreed:
            raise CheckpointSaveError(f"{self.key}: a process could not write its part; nothing was published")
        return write_manifest(work, self.group.size, self.sharding, self.extra, fs).files

    def committed(self, where: str) -> None:
        """Step 5: tell every rank where the checkpoint was published (``epochs/NNN`` or ``steps/GGG``)."""
        self._stage = "done"
        self.group.broadcast(f"{self.key}/committed", where, self.timeout_s)

    def failed(self, err: BaseException) -> None:
        """Complete the meeting points still ahead with the failure, so no rank waits for a save that is off."""
        word = f"{ERROR}{type(err).__name__}: {err}"
        try:
            if self._stage == "start":
                self.group.broadcast(f"{self.key}/work-ready", word, self.timeout_s)
                return
            if self._stage == "work-ready":
                self.group.all_agree(f"{self.key}/parts-written", False, self.timeout_s)
            if self._stage != "done":
                self.group.broadcast(f"{self.key}/committed", word, self.timeout_s)
        except GroupTimeout as late:
            logger.warning("could not tell every process that save %s failed: %s", self.key, late)
        self._stage = "done"


def write_rank_part(
    layout: L.Layout,
    group: Group,
    key: str,
    part: Part,
    *,
    fs: LocalFS | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """A non-primary's share of one multi-part commit; returns where it was published (``epochs/NNN``, ``steps/GGG``).

    Raises:
        CheckpointSaveError: this rank's part or the primary's commit failed (nothing was published).
        GroupTimeout: the primary, or another rank, did not come in time.
    """
    if is_primary(group):
        raise ValueError("write_rank_part is for ranks other than 0; the primary commits through CheckpointStore")
    word = group.broadcast(f"{key}/work-ready", None, timeout_s)
    if word != "ok":
        raise CheckpointSaveError(f"{key}: the primary could not start the save ({word.removeprefix(ERROR)})")
    error = None
    try:
        _write(part, layout.work, group.rank, fs or LocalFS())
    except Exception as err:
        error = err
    group.all_agree(f"{key}/parts-written", error is None, timeout_s)
    outcome = group.broadcast(f"{key}/committed", None, timeout_s)
    if error is not None:
        raise CheckpointSaveError(f"{key}: rank {group.rank} could not write its part: {error}") from error
    if outcome.startswith(ERROR):
        raise CheckpointSaveError(f"{key}: the primary did not publish the checkpoint ({outcome.removeprefix(ERROR)})")
    return outcome
