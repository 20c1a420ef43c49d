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
5. ``g.broadcast(key/committed, "epochs/NNN" | "steps/GGG" | "error: ...")``, followed by a space and the
   primary's note when it gives one (:attr:`SharedSave.note`: the step interval every rank adopts).

Non-primaries never take the lock, rename, link or prune. A failed or missing
part means nothing is published: ``work/`` is discarded and the previous
checkpoint stays what ``restart()`` picks. A process that dies anywhere leaves
``work/`` as debris (removed by the next writer), never a published mix.

**Node-local directories** (docs/campaigns.rst, "Multi-process jobs on
node-local disks"): each process's ``ckpt_directory`` may be its own node's
disk. The same meetings find out and carry what is needed, per save:

* at step 1 the primary writes a marker ``work/.primary-<nonce>`` and says
  ``ok <nonce> <generation>``; a rank that does not see the marker in its own
  ``work/`` is node-local (:func:`node_local_word`): it opens its own
  directory's store (its own lock) and commits there, under the primary's
  generation, through :class:`NodePart`;
* at step 3 such a rank posts its part index (the ``.json``'s bytes) instead of
  ``1``; the primary builds the manifest from those indexes and its own part
  (the same function of the same bytes) and says ``1`` followed by the manifest
  and the lineage;
* each node-local rank writes that manifest beside its part and publishes its
  own ``epochs/NNN`` once the primary's step 5 says it published. Its sidecar
  lists its own files and ``extra["node_local"]`` (``rank``, ``processes``;
  the primary's also ``files``: every rank's files, for the persistent tier).

Every process must be node-local, or every process share the primary's
directory: a mix fails the save, naming the processes.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from candle_ckpt.core import layout as L
from candle_ckpt.core.checksum import format_crc
from candle_ckpt.core.errors import CheckpointSaveError, GroupTimeout
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.core.group import Group, is_primary
from candle_ckpt.core.sidecar import FileEntry, Sidecar
from candle_ckpt.storage.commit import FileSpec
from candle_ckpt.storage.manifest import check_part, write_manifest
from candle_ckpt.storage.sharded import MANIFEST, Chunk, part_bin, part_index, write_part

logger = logging.getLogger("candle_ckpt.storage.multipart")

ERROR = "error: "
DEFAULT_TIMEOUT_S = 600.0
MARKER = ".primary-"  # the primary's marker in a fresh work/: who sees it shares its directory
LOCAL = "L"  # a node-local rank's word at parts-written: "L" and its part index
NODE_LOCAL = "node_local"  # the sidecar's extra key of a node-local checkpoint


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
    #: Every rank's files, when the others are node-local (the primary's sidecar lists its own only).
    every_file: dict[str, FileEntry] | None = None
    #: A word of the primary's carried to every rank with the outcome (the step interval: engine.step_plan),
    #: asked for at step 5, once the checkpoint is published; :attr:`said` keeps what it said.
    note: Callable[[], str] | None = None
    said: str = ""

    def __post_init__(self) -> None:
        if not is_primary(self.group):
            raise ValueError(f"SharedSave is the primary's (rank 0); this is rank {self.group.rank}")

    def work_ready(self, work: str | None = None, generation: int | None = None) -> None:
        """Step 1: tell the other ranks that ``work/`` is fresh and theirs to write into; with ``work``, leave a
        marker there and name it and ``generation`` (node-local ranks commit under it)."""
        self._stage = "work-ready"
        word = "ok"
        if work is not None:
            nonce = uuid.uuid4().hex[:16]
            open(os.path.join(work, MARKER + nonce), "wb").close()  # read by the others during this save only
            word = f"ok {nonce} {generation}"
        self.group.broadcast(f"{self.key}/work-ready", word, self.timeout_s)

    def gather(self, fs: LocalFS, work: str, template: Sidecar | None = None) -> dict[str, FileEntry]:
        """Steps 2-4: write the primary's part, wait for every rank's, check them all, write the manifest.

        Returns every file of the parts and the manifest, by name, for the sidecar (of node-local ranks, the
        primary's own files and the manifest; :attr:`every_file` has them all).
        """
        ok, error = True, None
        try:
            _write(self.part, work, 0, fs)
        except Exception as err:  # the others must still hear that this save is off
            ok, error = False, err
        name = f"{self.key}/parts-written"
        self._stage = "parts-written"  # a timeout in collect told every rank already (as all_agree does)
        values = self.group.collect(name, "1" if ok else "0", self.timeout_s) or ["1" if ok else "0"]
        remote = {r: v[len(LOCAL) :].encode() for r, v in enumerate(values) if r and v.startswith(LOCAL)}
        agreed = all(v == "1" or v.startswith(LOCAL) for v in values)
        word, built, why = "1" if agreed else "0", None, None
        try:  # nothing may raise before the broadcast: every rank waits for this word
            for marker in (n for n in os.listdir(work) if n.startswith(MARKER)):
                os.unlink(os.path.join(work, marker))
            if agreed and remote:
                built = self._node_local_manifest(fs, work, remote, template)
                word = "1" + json.dumps({"manifest": built[1], "lineage": template.lineage if template else None})
        except Exception as err:  # every rank hears that this save is off
            word, why = "0", err
        self.group.broadcast(name, word, self.timeout_s)
        if error is not None:
            raise error
        if why is not None:
            raise why
        if word == "0":
            raise CheckpointSaveError(f"{self.key}: a process could not write its part; nothing was published")
        if built is None:
            return write_manifest(work, self.group.size, self.sharding, self.extra, fs).files
        self.every_file = built[0].files
        mine = {part_bin(0), part_index(0), MANIFEST, *check_part(work, 0)["files"]}
        return {k: e for k, e in built[0].files.items() if k in mine}

    def _node_local_manifest(self, fs: LocalFS, work: str, remote: dict[int, bytes], template: Sidecar | None):
        """The manifest of a save whose other ranks wrote their parts on their own disks: (Manifest, its text)."""
        shared = [r for r in range(1, self.group.size) if r not in remote]
        if shared:
            raise CheckpointSaveError(
                f"{self.key}: ckpt_directory: processes {shared} share the primary's directory and processes "
                f"{sorted(remote)} do not; give every process its own node-local directory, or all one shared one"
            )
        built = write_manifest(work, self.group.size, self.sharding, self.extra, fs, remote=remote)
        with open(os.path.join(work, MANIFEST), encoding="utf-8") as f:
            return built, f.read()

    def finish_sidecar(self, side: Sidecar) -> Sidecar:
        """The primary's sidecar; of a node-local save, with ``extra["node_local"]`` (every rank's files)."""
        if self.every_file is None:
            return side
        every = {**self.every_file, **side.files}  # the parts' files, the manifest, the primary's own files
        files = {k: {"size": e.size, "crc32": e.crc32} for k, e in sorted(every.items())}
        info = {"rank": 0, "processes": self.group.size, "files": files}
        return replace(side, extra={**side.extra, NODE_LOCAL: info})

    def committed(self, where: str) -> None:
        """Step 5: tell every rank where the checkpoint was published (``epochs/NNN`` or ``steps/GGG``)."""
        self._stage = "done"
        self.said = self.note() if self.note is not None else ""
        self.group.broadcast(f"{self.key}/committed", f"{where} {self.said}" if self.said else where, self.timeout_s)

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


def split_note(outcome: str) -> tuple[str, str]:
    """A step-5 outcome as ``(where, note)``: ``"epochs/005 {...}"`` -> ``("epochs/005", "{...}")``."""
    where, _, note = outcome.partition(" ")
    return where, note


def hear_work_ready(group: Group, key: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """A non-primary's step 1: the primary's word (``ok`` or ``ok <nonce> <generation>``).

    Raises:
        CheckpointSaveError: the primary could not start the save.
    """
    word = group.broadcast(f"{key}/work-ready", None, timeout_s)
    if word.split(" ")[0] != "ok":
        raise CheckpointSaveError(f"{key}: the primary could not start the save ({word.removeprefix(ERROR)})")
    return word


def node_local_word(layout: L.Layout, word: str) -> int | None:
    """The primary's generation if this process does not see the primary's ``work/`` marker (its
    ``ckpt_directory`` is its own); None if it shares the primary's directory."""
    fields = word.split(" ")
    if len(fields) != 3 or os.path.exists(os.path.join(layout.work, MARKER + fields[1])):
        return None
    return int(fields[2])


def write_rank_part(
    layout: L.Layout,
    group: Group,
    key: str,
    part: Part,
    *,
    fs: LocalFS | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    heard: str | None = None,
) -> str:
    """A non-primary's share of one multi-part commit; returns the primary's outcome: where it was published
    (``epochs/NNN``, ``steps/GGG``), then its note if it gave one (:func:`split_note`).

    ``heard``: the primary's step-1 word if the caller already heard it (:func:`hear_work_ready`).

    Raises:
        CheckpointSaveError: this rank's part or the primary's commit failed (nothing was published).
        GroupTimeout: the primary, or another rank, did not come in time.
    """
    if is_primary(group):
        raise ValueError("write_rank_part is for ranks other than 0; the primary commits through CheckpointStore")
    if heard is None:
        hear_work_ready(group, key, timeout_s)
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


@dataclass
class NodePart:
    """A node-local rank's side of one commit, passed to its own store's ``commit(..., shared=)``: it writes its
    part into its own ``work/``, meets the primary at steps 3 and 5 and adds the manifest (see the module docstring).

    The store must take the primary's generation (``CheckpointStore.use_generation``) before the commit.
    """

    group: Group
    key: str
    part: Part
    timeout_s: float = DEFAULT_TIMEOUT_S
    lineage: str | None = None
    note: str = ""  # the primary's note, heard with the outcome
    _stage: str = "start"

    def work_ready(self, work: str | None = None, generation: int | None = None) -> None:
        """Step 1 was heard before this rank's store made its ``work/``."""

    def gather(self, fs: LocalFS, work: str, template: Sidecar | None = None) -> dict[str, FileEntry]:
        """Steps 2, 3 and 5: this rank's part and the manifest, once the primary published its own."""
        rank, name = self.group.rank, f"{self.key}/parts-written"
        self._stage = "done"  # from here on a failure is told in these meetings (or they timed out for all)
        error, value = None, "0"
        try:
            _write(self.part, work, rank, fs)
            with open(os.path.join(work, part_index(rank)), encoding="utf-8") as f:
                value = LOCAL + f.read()
        except Exception as err:
            error = err
        self.group.collect(name, value, self.timeout_s)
        word = self.group.broadcast(name, None, self.timeout_s)
        outcome = self.group.broadcast(f"{self.key}/committed", None, self.timeout_s)
        if error is not None:
            raise CheckpointSaveError(f"{self.key}: rank {rank} could not write its part: {error}") from error
        if word == "0" or not word.startswith("1"):
            raise CheckpointSaveError(f"{self.key}: a process could not write its part; nothing was published")
        if outcome.startswith(ERROR):
            raise CheckpointSaveError(
                f"{self.key}: the primary did not publish the checkpoint ({outcome.removeprefix(ERROR)})"
            )
        self.note = split_note(outcome)[1]
        body = json.loads(word[1:])
        self.lineage = body.get("lineage")
        value_crc, size = fs.write_bytes(os.path.join(work, MANIFEST), body["manifest"].encode("utf-8"))
        index = check_part(work, rank)
        files = {k: FileEntry(e["size"], e["crc32"]) for k, e in index["files"].items()}
        files[part_bin(rank)] = FileEntry(index["bin"]["size"], index["bin"]["crc32"])
        files[part_index(rank)] = index["_entry"]
        files[MANIFEST] = FileEntry(size, format_crc(value_crc))
        return files

    def finish_sidecar(self, side: Sidecar) -> Sidecar:
        """The sidecar of this rank's copy: the primary's lineage, ``extra["node_local"]``."""
        info = {"rank": self.group.rank, "processes": self.group.size}
        return replace(side, lineage=self.lineage or side.lineage, extra={**side.extra, NODE_LOCAL: info})

    def committed(self, where: str) -> None:
        """The primary said so at step 5 already."""

    def failed(self, err: BaseException) -> None:
        """Come to the meetings still ahead, saying this part failed, so that no rank waits for it."""
        if self._stage == "done":
            return
        self._stage = "done"
        try:
            self.group.collect(f"{self.key}/parts-written", "0", self.timeout_s)
            self.group.broadcast(f"{self.key}/parts-written", None, self.timeout_s)
            self.group.broadcast(f"{self.key}/committed", None, self.timeout_s)
        except GroupTimeout as late:
            logger.warning("could not tell the primary that save %s failed here: %s", self.key, late)
