"""Power-loss simulation for the commit protocol (the ALICE / RocksDB model).

:class:`RecordingFS` is a :class:`~candle_ckpt.core.fs.LocalFS` that performs
every operation for real *and* replays it on an in-memory model of what is
durable. After each operation it can list the states that a power cut at that
instant could leave behind:

* ``drop``: file data that was not fsynced is lost, and directory entries
  (creates, renames, links, unlinks) not made durable by an fsync of their
  parent directory are reverted;
* ``cut``: as ``drop``, but a random prefix of each file's unsynced writes
  reached the disk (the last one possibly torn);
* ``meta``: every directory operation reached the disk but unsynced file data
  did not (ext4 ``data=writeback``: a rename can overtake the data it names);
* ``meta-cut``: as ``meta``, with a random prefix of the unsynced writes.

The model of what is durable, and of what each variant keeps, is in
:mod:`candle_ckpt.testing.crashmodel`.

Only operations that go through the file system object are modelled; the
store routes every durable step of a save through it (``ckpt.log``, the
lock file and the writability probe do not matter for recovery and are taken
from the real directory as they were when recording started).

Several writers (the ranks of a multi-part commit, as threads) may share one
recorder: each operation and its replay run under one lock, and a power cut
hits every writer at the same instant, as on one machine.

Typical use::

    fs = RecordingFS(directory)
    ... build the writer with fs=fs, then:
    fs.start()                     # the directory as it is now counts as durable
    ... save ...
    fs.mark("commit returned")     # later crash points must keep this save
    states = fs.crash_states()     # [(CrashPoint, {relpath: entry}), ...]
    materialize(states[i][1], some_empty_dir)
"""

from __future__ import annotations

import os
import random
import threading

from candle_ckpt.core.checksum import CrcFile
from candle_ckpt.core.fs import LocalFS
from candle_ckpt.testing.crashmodel import (
    VARIANTS,
    CrashPoint,
    Node,
    clear,
    durable_state,
    load_tree,
    materialize,
    serial,
    state_digest,
)
from candle_ckpt.testing.faultfs import NoSymlinkFS


class OutsideRoot(AssertionError):
    """The code under test touched a path outside the recorded directory."""


class _RecordingFile(CrcFile):
    """A CrcFile that reports each write and truncate (offset and bytes) to the recorder."""

    def __init__(self, path: str, recorder: RecordingFS, node: Node) -> None:
        super().__init__(path, fsync=lambda fd: recorder.fsync(fd, path), on_write=recorder.hook)
        self._recorder = recorder
        self._serial_lock = recorder._serial_lock
        self._node = node

    @serial
    def write(self, data) -> int:
        offset = self._pos
        n = super().write(data)
        if n:
            self._recorder._write(self._node, offset, bytes(memoryview(data).cast("B")))
        return n

    @serial
    def truncate(self, size: int | None = None) -> int:
        size = super().truncate(size)
        self._recorder._truncate(self._node, size)
        return size

    @serial
    def close(self) -> None:
        was_closed = self.closed
        super().close()
        if not was_closed:
            self._recorder._log("close", self.path)


class RecordingFS(LocalFS):
    """A LocalFS that also replays every operation on a model of durable state.

    Args:
        root: The directory whose durable state is modelled (``ckpt_directory``).
            Any operation on a path outside it raises :class:`OutsideRoot`.
        seed: Seed of the random cuts of the ``cut`` variant.
    """

    def __init__(self, root: str | os.PathLike[str], seed: int = 0) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.rng = random.Random(seed)
        self.recording = False
        self.ops: list[str] = []
        self.marks: list[tuple[int, str]] = []
        self._states: list[tuple[CrashPoint, dict[str, tuple]]] = []
        self._tree: Node | None = None
        self._serial_lock = threading.RLock()

    # -- control -----------------------------------------------------------------
    @serial
    def start(self) -> None:
        """Take the directory as it is now as the durable starting state and record from here."""
        self._tree = load_tree(self.root)
        self.ops, self.marks, self._states = [], [], []
        self.recording = True
        self._emit("start")

    def stop(self) -> None:
        self.recording = False

    @serial
    def mark(self, label: str) -> None:
        """Note that something happened (e.g. a commit returned) after the ops so far."""
        self.marks.append((len(self.ops), label))

    @serial
    def crash_states(self) -> list[tuple[CrashPoint, dict[str, tuple]]]:
        """Every crash point recorded so far with the state it leaves (one per variant)."""
        out = []
        for point, state in self._states:
            marks = tuple(label for at, label in self.marks if at <= point.index)
            out.append((CrashPoint(point.index, point.op, point.variant, marks), state))
        return out

    # -- the recorded operations ---------------------------------------------------
    @serial
    def create(self, path: str) -> CrcFile:
        self.hook("create", path)
        if not self.recording:
            return CrcFile(path, fsync=lambda fd: self.fsync(fd, path), on_write=self.hook)
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None or node.kind != "file":
            node = Node("file")
            parent.entries[name] = node
        f = _RecordingFile(path, self, node)
        if node.data:
            self._truncate(node, 0)
        self._log("create", path)
        return f

    @serial
    def fsync(self, fd: int, path: str) -> None:
        super().fsync(fd, path)
        if self.recording:
            node = self._lookup(path)
            node.durable = bytes(node.data)
            node.pending.clear()
            self._log("fsync", path)

    @serial
    def mkdir(self, path: str) -> None:
        # Record each mkdir right after it happened, before any fsync of its parent.
        super().mkdir(path)
        if self.recording:
            parent, name = self._parent(path)
            parent.entries[name] = Node("dir")
            self._log("mkdir", path)

    @serial
    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        if self.recording:
            node = self._lookup(path)
            node.durable_entries = dict(node.entries)
            self._log("fsync_dir", path)

    @serial
    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self._move(src, dst, "rename")

    @serial
    def replace(self, src: str, dst: str) -> None:
        super().replace(src, dst)
        self._move(src, dst, "replace")

    @serial
    def unlink(self, path: str) -> None:
        super().unlink(path)
        if self.recording:
            parent, name = self._parent(path)
            parent.entries.pop(name, None)
            self._log("unlink", path)

    @serial
    def rmtree(self, path: str) -> None:
        super().rmtree(path)
        if self.recording:
            parent, name = self._parent(path)
            node = parent.entries.pop(name, None)
            if node is not None:
                clear(node)
            self._log("rmtree", path)

    @serial
    def symlink(self, target: str, path: str) -> None:
        super().symlink(target, path)
        if self.recording:
            parent, name = self._parent(path)
            parent.entries[name] = Node("link", target=target)
            self._log("symlink", path)

    # -- model ------------------------------------------------------------------------
    def _rel_parts(self, path: str) -> list[str]:
        path = os.path.abspath(path)
        if path != self.root and not path.startswith(self.root + os.sep):
            raise OutsideRoot(f"operation on {path}, outside {self.root}")
        rel = os.path.relpath(path, self.root)
        return [] if rel == "." else rel.split(os.sep)

    def _lookup(self, path: str) -> Node:
        node = self._tree
        for part in self._rel_parts(path):
            node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        parts = self._rel_parts(path)
        if not parts:
            raise OutsideRoot(f"operation on the root {path} itself")
        node = self._tree
        for part in parts[:-1]:
            node = node.entries[part]
        return node, parts[-1]

    def _move(self, src: str, dst: str, op: str) -> None:
        if not self.recording:
            return
        sparent, sname = self._parent(src)
        dparent, dname = self._parent(dst)
        node = sparent.entries.pop(sname)
        old = dparent.entries.get(dname)
        if old is not None and old is not node and old.kind == "dir":
            clear(old)
        dparent.entries[dname] = node
        self._log(op, f"{src} -> {dst}")

    def _write(self, node: Node, offset: int, data: bytes) -> None:
        if not self.recording:
            return
        end = offset + len(data)
        if len(node.data) < end:
            node.data.extend(bytes(end - len(node.data)))
        node.data[offset:end] = data
        node.pending.append((offset, data, 0))
        self._log("write", f"{len(data)} bytes at {offset}")

    def _truncate(self, node: Node, size: int) -> None:
        if not self.recording:
            return
        del node.data[size:]
        if len(node.data) < size:
            node.data.extend(bytes(size - len(node.data)))
        node.pending.append((0, None, size))
        self._log("truncate", str(size))

    def _log(self, op: str, detail: str) -> None:
        self.ops.append(f"{op} {os.path.relpath(detail, self.root) if detail.startswith('/') else detail}")
        self._emit(op)

    def _emit(self, op: str) -> None:
        index = len(self.ops)
        for variant in VARIANTS:
            state = durable_state(self._tree, variant, self.rng)
            self._states.append((CrashPoint(index, op, variant, ()), state))


class RecordingNoSymlinkFS(NoSymlinkFS, RecordingFS):
    """:class:`RecordingFS` on a file system without symlinks (``symlink`` fails as in :class:`NoSymlinkFS`)."""


__all__ = [
    "VARIANTS",
    "CrashPoint",
    "NoSymlinkFS",
    "OutsideRoot",
    "RecordingFS",
    "RecordingNoSymlinkFS",
    "materialize",
    "state_digest",
]
