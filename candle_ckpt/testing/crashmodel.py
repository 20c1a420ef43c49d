"""The model of what a power cut leaves behind, for :mod:`candle_ckpt.testing.crashsim`.

A tree of :class:`Node` holds each file's data and directory's entries twice:
as they are now, and as the last fsync made them durable. :func:`durable_state`
flattens what survives a cut under each variant of :data:`VARIANTS` (see the
crashsim module); :func:`state_digest` and :func:`materialize` let a test run
each distinct state once, in a real directory.

The model is the simple one the crash-consistency literature starts from: an
fsync of a file persists its data; an fsync of a directory persists its
entries. A file's data is tracked per inode, so a rename carries it along.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
from dataclasses import dataclass, field

VARIANTS = ("drop", "cut", "meta", "meta-cut")


@dataclass
class Node:
    """A file, directory or symlink as the last fsync left it (``durable*``) and as it is now."""

    kind: str  # "file", "dir" or "link"
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    pending: list[tuple[int, bytes | None, int]] = field(default_factory=list)  # (offset, data|None=truncate, size)
    entries: dict[str, Node] = field(default_factory=dict)
    durable_entries: dict[str, Node] = field(default_factory=dict)
    target: str = ""


@dataclass(frozen=True)
class CrashPoint:
    """Where a simulated power cut happens.

    Attributes:
        index: Number of operations that had completed.
        op: The last completed operation (``"start"`` for none).
        variant: ``drop``, ``cut``, ``meta`` or ``meta-cut`` (see the module docstring).
        marks: The marks recorded before this point (e.g. "commit returned").
    """

    index: int
    op: str
    variant: str
    marks: tuple[str, ...]


def serial(method):
    """Run a recorder's ``method`` under its ``_serial_lock``: an operation and its replay are one step."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._serial_lock:
            return method(self, *args, **kwargs)

    return run


def clear(node: Node) -> None:
    """An rmtree: the entries go from the in-memory view; what was durable stays durable."""
    for child in node.entries.values():
        if child.kind == "dir":
            clear(child)
    node.entries = {}


def file_bytes(node: Node, variant: str, rng: random.Random) -> bytes:
    """A file after a power cut: its durable bytes, plus a random prefix of the unsynced writes (``cut``)."""
    if not variant.endswith("cut") or not node.pending:
        return node.durable
    data = bytearray(node.durable)
    keep = rng.randint(0, len(node.pending))
    for i, (offset, chunk, size) in enumerate(node.pending[: keep + 1]):
        if chunk is None:
            if i == keep:
                break
            del data[size:]
            data.extend(bytes(max(0, size - len(data))))
            continue
        if i == keep:  # the write being torn by the power cut
            chunk = chunk[: rng.randint(0, len(chunk))]
        end = offset + len(chunk)
        if len(data) < end:
            data.extend(bytes(end - len(data)))
        data[offset:end] = chunk
    return bytes(data)


def durable_state(tree: Node, variant: str, rng: random.Random) -> dict[str, tuple]:
    """Flatten what survives a power cut now: {relpath: ("dir",) | ("file", bytes) | ("link", target)}."""
    out: dict[str, tuple] = {}

    def walk(node: Node, prefix: str, depth: int) -> None:
        if depth > 32:  # a directory renamed into itself cannot happen; guard anyway
            raise RuntimeError("model tree too deep")
        entries = node.entries if variant.startswith("meta") else node.durable_entries
        for name, child in sorted(entries.items()):
            rel = f"{prefix}{name}"
            if child.kind == "dir":
                out[rel] = ("dir",)
                walk(child, rel + "/", depth + 1)
            elif child.kind == "link":
                out[rel] = ("link", child.target)
            else:
                out[rel] = ("file", file_bytes(child, variant, rng))

    walk(tree, "", 0)
    return out


def load_tree(root: str) -> Node:
    """Model the directory as it is now, everything durable."""
    node = Node("dir")
    if not os.path.isdir(root):
        return node
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.islink(path):
            child = Node("link", target=os.readlink(path))
        elif os.path.isdir(path):
            child = load_tree(path)
        else:
            with open(path, "rb") as f:
                data = f.read()
            child = Node("file", data=bytearray(data), durable=data)
        node.entries[name] = child
    node.durable_entries = dict(node.entries)
    return node


def state_digest(state: dict[str, tuple]) -> str:
    """A digest of a crash state, to run each distinct state once."""
    h = hashlib.sha256()
    for rel, entry in sorted(state.items()):
        h.update(rel.encode() + b"\0" + entry[0].encode() + b"\0")
        if entry[0] == "file":
            h.update(hashlib.sha256(entry[1]).digest())
        elif entry[0] == "link":
            h.update(entry[1].encode())
    return h.hexdigest()


def materialize(state: dict[str, tuple], root: str | os.PathLike[str]) -> None:
    """Write a crash state into the empty (or missing) directory ``root``."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    for rel, entry in sorted(state.items()):
        path = os.path.join(root, rel)
        if entry[0] == "dir":
            os.makedirs(path, exist_ok=True)
        elif entry[0] == "link":
            os.symlink(entry[1], path)
        else:
            with open(path, "wb") as f:
                f.write(entry[1])
