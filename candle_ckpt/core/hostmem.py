"""How much host memory this process may still take, and whether an asynchronous save's copy fits in it.

An asynchronous save copies the state into host memory before training goes on (docs/async.rst). On a cluster
the limit that matters is usually not the node's: Slurm and PBS put each job in a cgroup whose limit may be a
small share of it, and a copy that passes the node's ``MemAvailable`` can still get the job killed by the
cgroup's out-of-memory killer. :func:`available` is the least of the kernel's estimate for the node and the room
left under every memory limit of this process's cgroup and its ancestors (cgroup v2 and v1).
"""

from __future__ import annotations

import os

from candle_ckpt.core.log import human_bytes

# A copy may take at most this share of the memory available: training, the writer and the file system's cache
# need the rest.
COPY_SHARE = 0.5


def available(root: str = "/") -> int | None:
    """Bytes of host memory this process may still take, or None where nothing tells (not Linux).

    Args:
        root: Where ``/proc`` and ``/sys`` are found (tests give a directory laid out like them).
    """
    found = [n for n in (_meminfo(root), *_cgroup_room(root)) if n is not None]
    return max(0, min(found)) if found else None


def copy_refused(nbytes: int, root: str = "/") -> str | None:
    """Why a host copy of ``nbytes`` should not be taken (it would leave too little memory), or None if it fits."""
    room = available(root)
    if room is None or nbytes <= COPY_SHARE * room:
        return None
    return (
        f"the host copy of an asynchronous save ({human_bytes(nbytes)}) would take more than half of the memory this "
        f"process may still use ({human_bytes(room)}, within its cgroup's limit)"
    )


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _meminfo(root: str) -> int | None:
    """The kernel's estimate of the memory available on the node (``MemAvailable``), in bytes."""
    text = _read(os.path.join(root, "proc/meminfo")) or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _number(text: str | None) -> int | None:
    """A cgroup file's number; None for ``max``, a missing file or anything else."""
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


def _cgroup_room(root: str) -> list[int | None]:
    """Limit minus usage for each memory-limited cgroup from this process's up to the root (v2, else v1)."""
    text = _read(os.path.join(root, "proc/self/cgroup")) or ""
    rooms: list[int | None] = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one unified hierarchy
            base, limit_file, usage_file = "sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_file, usage_file = "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            where = os.path.join(root, base, *parts[:depth])
            limit = _number(_read(os.path.join(where, limit_file)))
            usage = _number(_read(os.path.join(where, usage_file)))
            # v1 says "no limit" as a huge number (a page-rounded 2**63 - 1): not a limit.
            if limit is not None and usage is not None and limit < 1 << 62:
                rooms.append(limit - usage)
    return rooms


__all__ = ["COPY_SHARE", "available", "copy_refused"]
