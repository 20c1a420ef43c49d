"""The restart history of one training: every start, restore, failure and refusal, kept beside its checkpoints.

One JSON object per line, appended, in ``<ckpts>/restarts.jsonl`` (``Layout.history``); on the persistent tier
the same file sits at ``<url>/restarts.jsonl`` and travels with the checkpoints to whichever node the run lands
on. The reader takes the union of both by record ``id`` and orders it by ``time``. Nothing here decides anything
but what the records say: :func:`no_progress_restarts` counts how often the newest checkpoint was resumed with no
commit after it (a crash loop), :func:`failure_rate` how often the run failed per second of wall time (for the
automatic step interval). A line that cannot be parsed (a write cut by a kill) is skipped, never an error.

Records (``v`` 1), every one with ``v``, ``id``, ``event``, ``time`` (Unix seconds), ``host``, ``pid``:

- ``{"event": "restart", "resumed": "epochs/005" | "steps/012" | null, "epoch": 5, "step": null, "generation": 7,
  "source": "fast" | "persistent" | null, "lineage": "...", "start": {...}}``: a ``restart()`` (``resumed`` null:
  nothing to resume, a fresh start);
- ``{"event": "failure", "restart": "<id of the restart>", "error": "ValueError: ...", "phase": "step"}``: the
  process ended by an uncaught error, or by the watchdog (``"error": "hang"``, ``phase`` the one that hung);
- ``{"event": "progress", "restart": "<id of the restart>"}``: the first checkpoint this start committed (once a
  start). A run whose node is lost with its undrained commits resumes the same checkpoint again, yet it made
  progress: this record keeps such a run from being taken for a crash loop;
- ``{"event": "refused", "resumed": "epochs/005", "count": 3, "last_failure": "..."}``: ``restart()`` refused
  to resume a crash loop once more, and the process exits with :data:`CRASH_LOOP_EXIT`.

Extensions (readers of ``v`` 1 ignore them): every record may carry ``process``, a token of the process that
wrote it (one per process, so that several ``restart()`` calls of one process count as one start); a later
line with the ``id`` of an earlier record *completes* it (its fields, ``time`` aside, are added to the earlier
record's: the start's first step, known only after ``restart()``, is written so).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

HISTORY_FILE = "restarts.jsonl"
VERSION = 1
EVENTS = ("restart", "failure", "refused", "progress")
MAX_LINE = 64 * 1024  # a record longer than this is cut to its essentials by the writer
#: The exit status of a process whose ``restart()`` refused a crash loop (docs/preemption.rst, "Crash loops").
#: Distinct from the watchdog's 124 (a hang, requeued); a scheduler script must not requeue this one.
CRASH_LOOP_EXIT = 65


def new_record(event: str, **fields: Any) -> dict[str, Any]:
    """A record of ``event`` stamped with this process (``v``, ``id``, ``time``, ``host``, ``pid``) and ``fields``."""
    if event not in EVENTS:
        raise ValueError(f"history event must be one of {', '.join(EVENTS)}; got {event!r}")
    record: dict[str, Any] = {
        "v": VERSION,
        "id": uuid.uuid4().hex,
        "event": event,
        "time": round(time.time(), 3),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    record.update(fields)
    return record


def encode(record: Mapping[str, Any]) -> bytes:
    """One line of the file (compact JSON and a newline)."""
    return (json.dumps(dict(record), separators=(",", ":"), sort_keys=True, default=str) + "\n").encode()


def append_local(path: str, record: Mapping[str, Any]) -> None:
    """Append ``record`` to the history file ``path`` (created with its directory), one ``write`` and an fsync.

    Appends of one short line by ``O_APPEND`` land whole or not at all on a local file system; a cut line is
    skipped by :func:`parse`.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, encode(record))
        os.fsync(fd)
    finally:
        os.close(fd)


def parse(data: bytes | str) -> list[dict[str, Any]]:
    """The records of a history file's bytes, in file order; lines that are not a record are skipped."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    out: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") in EVENTS and isinstance(record.get("time"), int | float):
            earlier = by_id.get(str(record.get("id")))
            if earlier is not None:  # a completion of an earlier record (module docstring)
                _complete(earlier, record)
                continue
            if record.get("id") is not None:
                by_id[str(record["id"])] = record
            out.append(record)
    return out


def _complete(earlier: dict[str, Any], later: Mapping[str, Any]) -> None:
    """Add ``later``'s fields (``time`` aside; mappings merged one level deep) to the record it completes."""
    for key, value in later.items():
        if key == "time":
            continue
        if isinstance(value, Mapping) and isinstance(earlier.get(key), Mapping):
            earlier[key] = {**earlier[key], **value}
        else:
            earlier[key] = value


def read_local(path: str) -> list[dict[str, Any]]:
    """The records of the history file ``path`` (none if it does not exist)."""
    try:
        with open(path, "rb") as f:
            return parse(f.read())
    except (FileNotFoundError, NotADirectoryError):  # no history yet; a bad ckpt_directory is named later
        return []


def merge(*histories: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The union of several copies of one history (the fast and the persistent tier's), by ``id``, by time."""
    seen: dict[str, dict[str, Any]] = {}
    for history in histories:
        for record in history:
            key = str(record.get("id") or encode(record))
            if key in seen:
                _complete(seen[key], record)  # one copy may be completed where the other is not
            else:
                seen[key] = dict(record)
    return sorted(seen.values(), key=lambda r: (r["time"], str(r.get("id"))))


def restarts(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``restart`` records, in order."""
    return [r for r in records if r.get("event") == "restart"]


def no_progress_restarts(records: Iterable[Mapping[str, Any]], resumed: str | None) -> int:
    """How many times in a row, counting back from the newest restart, ``resumed`` was resumed by a process that
    then failed (a ``failure`` record: an uncaught error, or a hang the watchdog ended) before committing.

    A start that committed (a ``progress`` record), a refusal (the operator looked at the loop and started again)
    or a resume of another checkpoint ends the count. A start that ended with no record of its own (SIGKILL,
    preemption, power loss, a node lost with commits not yet drained: the node's fate, not the job's) is passed
    over: it neither counts nor ends the count, so a job killed from outside is never taken for a crash loop.
    """
    if resumed is None:
        return 0
    count = 0
    for record, failed in _starts_back(records):
        if record.get("resumed") != resumed:
            break
        count += failed
    return count


def hung_restores(records: Iterable[Mapping[str, Any]]) -> tuple[int, str | None]:
    """``(count, name)``: how many starts in a row, counting back from the newest restart, hung in their restore
    (a ``failure`` ``hang`` in phase ``restore``: the read of a checkpoint never returned), and the checkpoint
    the newest of them was reading (None if it hung before it knew). As :func:`no_progress_restarts`, a
    ``progress`` or ``refused`` record ends the count and a start with no record of its own is passed over; any
    other start ends it. ``records``: one ``restart`` per process."""
    records = list(records)
    hung = {
        r.get("restart")
        for r in records
        if (r.get("event"), r.get("error"), r.get("phase")) == ("failure", "hang", "restore")
    }
    count, name = 0, None
    for record, failed in _starts_back(records):
        if not failed:
            continue
        if record.get("id") not in hung:
            break
        name = name if count else record.get("resumed")
        count += 1
    return count, name


def _starts_back(records: Iterable[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], bool]]:
    """The ``restart`` records, newest first, until a ``progress`` or ``refused`` record, each with whether its
    process then failed (a ``failure`` record of it, or of its process): what both counts above walk."""
    records = list(records)
    failures = [r for r in records if r.get("event") == "failure"]
    failed = {_life(r) for r in failures} | {r.get("restart") for r in failures if r.get("restart")}
    for record in reversed(records):
        if record.get("event") in ("refused", "progress"):
            return
        if record.get("event") == "restart":
            yield record, record.get("id") in failed or _life(record) in failed


def _life(record: Mapping[str, Any]) -> tuple[Any, Any]:
    """The process a record was written by (its host and pid)."""
    return record.get("host"), record.get("pid")


def last_failure(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The newest failure's error line, or None."""
    for record in reversed(list(records)):
        if record.get("event") == "failure":
            return str(record.get("error") or "an error with no message")
    return None


def failure_rate(records: Iterable[Mapping[str, Any]], now: float | None = None) -> tuple[int, float]:
    """``(failures, seconds)``: the restarts after the first one, and the wall time they are spread over.

    Every restart after the first means the process before it did not finish (preempted, killed, crashed). So
    does a first record that resumed a checkpoint: a fresh start writes no record where there is no persistent
    tier (engine/restore.py: a job that never fails leaves no file), so the process that made that checkpoint
    and then failed is counted from the resume alone. The seconds run from the first record to ``now``. ``(0, s)``
    for a run that never failed.
    """
    starts = restarts(records)
    if not starts:
        return 0, 0.0
    end = time.time() if now is None else now
    unrecorded = 1 if starts[0].get("resumed") is not None else 0  # the fresh start before it, that failed
    return len(starts) - 1 + unrecorded, max(0.0, end - float(starts[0]["time"]))


__all__ = [
    "CRASH_LOOP_EXIT",
    "EVENTS",
    "HISTORY_FILE",
    "append_local",
    "encode",
    "failure_rate",
    "hung_restores",
    "last_failure",
    "merge",
    "new_record",
    "no_progress_restarts",
    "parse",
    "read_local",
    "restarts",
]
