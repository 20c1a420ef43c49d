"""The restart history as the restore driver keeps it: records, the crash-loop refusal, and each start's clock.

The format is :mod:`candle_ckpt.core.history`'s. Here it is read from both tiers (``<ckpts>/restarts.jsonl``
and, with ``ckpt_persistent_url``, ``<url>/restarts.jsonl``, merged) and appended to both, by the primary
process only; a write that fails is one warning, never an error: the history serves the run, it never stops
it, except for the one refusal below.

- :class:`History`: one directory's history (read, append).
- :func:`refuse_crash_loop`: ``restart()`` refuses to resume a checkpoint that was resumed
  ``ckpt_max_no_progress_restarts`` times in a row, this time included, with no commit after it: one line,
  a ``refused`` record, exit status :data:`~candle_ckpt.core.history.CRASH_LOOP_EXIT`;
  :func:`refuse_hung_restore` the same, before reading, when the starts before hung reading it.
- :class:`Start`: this process's start (one per process: the first ``restart()``, or the first run when there
  was none), with its breakdown (``import_s``: process start to ``restart()``; ``choose_s``, ``verify_s``,
  ``read_s``, ``restore_s``: the restore; ``first_step_s``: ``restart()``'s return, or the run's begin, to
  the first step's end). :func:`current_start` gives it to ``stats()``; the first step completes the
  ``restart`` record and writes one ``ckpt.log`` line. A process that ends by an uncaught exception after
  it appends a ``failure`` record (``sys.excepthook``, chained).

A process is the unit of a start, so its records carry a ``process`` token: several ``restart()`` calls of one
process count once, and a process never refuses a checkpoint it has already resumed itself.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from candle_ckpt.config.params import CkptConfig
from candle_ckpt.core import history as H
from candle_ckpt.core import layout as L
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.sidecar import Sidecar

# This process's token in the records it writes (module docstring); a forked child gets its own (below).
_TOKEN = [uuid.uuid4().hex]


def process_token() -> str:
    """This process's token (a new one in every forked child)."""
    return _TOKEN[0]


def process_start_time() -> float | None:
    """The wall-clock time this process started, from the OS (Linux: ``/proc/self/stat``), or None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime, in clock ticks since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class History:
    """The restart history of ``cfg``'s checkpoints, on the fast tier and the persistent one (if any).

    Args:
        cfg: The job's configuration.
        log: Where a failed read or write is said (once).
        writes: Whether this process appends (the primary of a job of several).
    """

    def __init__(self, cfg: CkptConfig, log: OpsLog, writes: bool) -> None:
        self.cfg, self.log, self.writes = cfg, log, writes
        self.layout = L.Layout.of(cfg)
        self.path = self.layout.history
        self._said = False

    def records(self) -> list[dict[str, Any]]:
        """Both tiers' records, merged (:func:`~candle_ckpt.core.history.merge`)."""
        local = H.read_local(self.path)
        if not self.cfg.persistent:
            return local
        try:
            tier, path = self._tier()
            try:
                remote = H.parse(tier.fs.cat_file(path))
            except FileNotFoundError:
                remote = []
        except Exception as err:  # noqa: BLE001 - the history never stops a restart
            self._problem("read", err)
            remote = []
        return H.merge(local, remote)

    def append(self, record: Mapping[str, Any], *, background: bool = False, local: bool = True) -> None:
        """Append ``record`` to each tier's copy (the primary only; the fast tier's only where it exists).

        ``background``: the persistent tier's copy is written on a thread (off the training thread). ``local``:
        False writes the persistent tier's copy only.
        """
        if not self.writes:
            return
        try:
            if local and os.path.isdir(self.layout.ckpts):  # nothing is created for a fresh start with nowhere to write
                H.append_local(self.path, record)
        except OSError as err:
            self._problem("write", err)
        if not self.cfg.persistent:
            return
        if background:
            thread = threading.Thread(target=self._append_persistent, args=(record,), daemon=True)
            _APPENDS.add(thread)
            thread.start()
        else:
            self._append_persistent(record)

    def _tier(self) -> tuple[Any, str]:
        from candle_ckpt.storage.remote import PersistentTier, remote_path  # noqa: PLC0415 (fsspec on demand)

        tier = PersistentTier.of(self.cfg)
        return tier, remote_path(tier.root, H.HISTORY_FILE)

    def _append_persistent(self, record: Mapping[str, Any]) -> None:
        """An append on a POSIX path; elsewhere (an object store has no append) the file is rewritten whole."""
        try:
            self._write_persistent(record)
        finally:
            _APPENDS.discard(threading.current_thread())

    def _write_persistent(self, record: Mapping[str, Any]) -> None:
        try:
            tier, path = self._tier()
            if tier.posix:
                H.append_local(path, record)
                return
            try:
                old = tier.fs.cat_file(path)
            except FileNotFoundError:
                old = b""
            with tier.fs.open(path, "wb") as f:
                f.write(old + H.encode(record))
        except Exception as err:  # noqa: BLE001 - the history never stops a run
            self._problem("write", err)

    def _problem(self, what: str, err: Exception) -> None:
        if not self._said:
            self._said = True
            self.log.warning(f"restart history: could not {what} {H.HISTORY_FILE}: {err}")


# The persistent tier's appends under way on their threads (History.append(background=True)): a process that exits
# waits for them, bounded, so that a start's last record (its progress) is not cut off by the exit.
_APPENDS: set[threading.Thread] = set()
EXIT_WAIT_S = 10.0


@atexit.register
def _join_appends() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_APPENDS):
        thread.join(max(0.0, deadline - time.monotonic()))


def resumed_name(layout: L.Layout, side: Sidecar) -> str:
    """The history's name of a checkpoint: ``epochs/005`` or ``steps/012`` (relative to ``<ckpts>``)."""
    from candle_ckpt.engine.resume import checkpoint_dir  # noqa: PLC0415 (resume imports this module)

    return os.path.relpath(checkpoint_dir(layout, side), layout.ckpts).replace(os.sep, "/")


def finished(cfg: CkptConfig, side: Sidecar) -> bool:
    """A finished run's checkpoint: its reruns resume it again and again, and that is no loop."""
    done = side.step is None and cfg.epochs is not None and side.epoch >= cfg.epochs
    return bool(side.extra.get("finished")) or done


def refuse_crash_loop(
    cfg: CkptConfig, history: History, records: list[dict[str, Any]], name: str, side: Sidecar
) -> None:
    """Exit with :data:`~candle_ckpt.core.history.CRASH_LOOP_EXIT` if resuming ``name`` now makes it
    ``ckpt_max_no_progress_restarts`` resumes in a row with no commit after it (``records``: as read before).

    Raises:
        SystemExit: the refusal (a ``refused`` record and one line in ``ckpt.log`` first).
    """
    limit = cfg.max_no_progress_restarts
    if not limit or finished(cfg, side) or any(r.get("process") == process_token() for r in records):
        return
    count = H.no_progress_restarts(_one_per_process(records), name) + 1
    if count < limit:
        return
    last = H.last_failure(records)
    _refuse(history, name, count, last, (
        f"restart: refused: {name} has been resumed {count} times in a row, this time included, with no checkpoint "
        f"committed after it (ckpt_max_no_progress_restarts={limit}); last failure: {last or 'none recorded'}; "
        f"exit status {H.CRASH_LOOP_EXIT}: fix the cause and start again (this refusal ends the count), or set "
        "ckpt_max_no_progress_restarts=0"
    ))  # fmt: skip


def refuse_hung_restore(cfg: CkptConfig, history: History, records: list[dict[str, Any]]) -> None:
    """Exit with :data:`~candle_ckpt.core.history.CRASH_LOOP_EXIT`, before anything is read, if the starts before
    this one hung in their restore (:func:`~candle_ckpt.core.history.hung_restores`: a read that never returned,
    ended by the restore's watchdog) and this one would make ``ckpt_max_no_progress_restarts`` in a row. Their
    read would hang again before :func:`refuse_crash_loop` could refuse."""
    limit = cfg.max_no_progress_restarts
    if not limit or any(r.get("process") == process_token() for r in records):
        return
    count, name = H.hung_restores(_one_per_process(records))
    if count + 1 < limit:
        return
    what = name or "the checkpoint to resume from"
    _refuse(history, what, count + 1, "hang in phase restore", (
        f"restart: refused: reading {what} hung in the last {count} starts in a row (the watchdog ended each, "
        f"phase restore), with no checkpoint committed since (ckpt_max_no_progress_restarts={limit}); exit status "
        f"{H.CRASH_LOOP_EXIT}: fix the file system it is read from, or move it aside to resume the one before it, "
        "and start again (this refusal ends the count), or set ckpt_max_no_progress_restarts=0"
    ))  # fmt: skip


def _refuse(history: History, name: str, count: int, last: str | None, line: str) -> None:
    """The refusal: a ``refused`` record, ``line`` in ``ckpt.log`` (and on stderr without a logger), the exit."""
    history.append(H.new_record("refused", resumed=name, count=count, last_failure=last, process=process_token()))
    history.log.error(line)
    if history.log.logger is None:  # the process's last word reaches the console whatever the logger
        print(f"ERROR {line}", file=sys.stderr)
    raise SystemExit(H.CRASH_LOOP_EXIT)


def _one_per_process(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with only the first ``restart`` of each process (records without a token are kept)."""
    seen: set[str] = set()
    out = []
    for record in records:
        token = record.get("process")
        if record.get("event") == "restart" and token is not None:
            if token in seen:
                continue
            seen.add(token)
        out.append(record)
    return out


class Start:
    """This process's start: its breakdown, and the ``restart`` record that carries it (None without one)."""

    def __init__(
        self, breakdown: dict[str, Any], history: History | None, record: dict[str, Any] | None, written: bool = True
    ) -> None:
        self.breakdown, self.history, self.record = breakdown, history, record
        self.written = written  # False: held back until the first step, or a failure (engine/restore.py)
        self.since = time.perf_counter()  # restart()'s return: the first step is timed from here
        self.stepped = False
        self.progressed = False  # a checkpoint was committed since this start (committed())


# The process's start: one per process by nature (the failure hook reads it at exit); set by the first restart().
_START: list[Start] = []


def _forked() -> None:
    """A forked child (a job server's) is a process, and a start, of its own."""
    _TOKEN[0] = uuid.uuid4().hex
    _START.clear()
    _APPENDS.clear()  # the parent's appends are the parent's to wait for


os.register_at_fork(after_in_child=_forked)


def current_start() -> dict[str, Any] | None:
    """This process's start breakdown (for ``stats()["start"]``), or None before any."""
    return dict(_START[0].breakdown) if _START else None


def with_this_start(records: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """``records`` (the history at ``path``) with this process's own ``restart`` record, if it has one of that
    history not written yet (a resume's record waits for its first step; the failure rate of a fit that begins
    before it counts this restart too). A start of another run's directory (one process training several) is not
    this run's."""
    start = _START[0] if _START else None
    if start is None or start.record is None or start.history is None or start.history.path != path:
        return records
    if any(r.get("id") == start.record.get("id") for r in records):
        return records
    return [*records, start.record]


def began(record: dict[str, Any], breakdown: dict[str, Any], history: History, *, written: bool = True) -> None:
    """A ``restart()`` of this process returned (the first one counts); ``record``: its ``restart`` record,
    ``written`` already or not (then written with a failure, if one comes)."""
    if not _START:
        _START.append(Start(breakdown, history, record, written))
        _hook_failures()


def run_began() -> None:
    """A run begins: with no ``restart()`` before it in this process, its start is timed from here."""
    if not _START:
        breakdown = {"import_s": seconds_since_process_start(), "restore_s": None}
        _START.append(Start(breakdown, None, None))


def first_step(log: OpsLog, writes: bool) -> None:
    """The first step of this process ended: its time goes into the breakdown, the ``restart`` record (completed)
    and one ``ckpt.log`` line (``writes``: this process logs it). Once per process."""
    if not _START or _START[0].stepped:
        return
    start = _START[0]
    start.stepped = True
    start.breakdown["first_step_s"] = round(time.perf_counter() - start.since, 3)
    if writes:
        log.info(f"start: {describe(start.breakdown)}")
    if start.record is None or start.history is None:
        return
    if start.written:  # the record is completed (the persistent tier's copy off the training thread)
        start.history.append({**start.record, "start": dict(start.breakdown)}, background=True)
    elif start.record.get("resumed") is not None:  # a resume's record, held back until now (engine/restore.py)
        start.written = True
        start.history.append({**start.record, "start": dict(start.breakdown)})
    elif start.history.cfg.persistent:  # a fresh start that trains: the persistent copy only (where a run that
        start.written = True  # moves is followed from: the host it started on), no file in the fast tier
        start.history.append({**start.record, "start": dict(start.breakdown)}, local=False)


def committed() -> None:
    """This process committed a checkpoint: its start made progress. The first time, a ``progress`` record (the
    primary's, on both tiers; the persistent copy off the training thread), so that a run that loses its node with
    commits not yet drained is not taken for a crash loop when it resumes the same checkpoint again."""
    if not _START or _START[0].progressed:
        return
    start = _START[0]
    start.progressed = True
    if start.history is None or start.record is None or not start.written:
        return  # no record of this start (a fresh start without a persistent tier): nothing to say progress of
    local = start.record.get("resumed") is not None  # a fresh start's record is on the persistent tier only
    start.history.append(H.new_record("progress", restart=start.record.get("id")), background=True, local=local)


def describe(breakdown: Mapping[str, Any]) -> str:
    """``3.912 s from process start to restart(); restore 0.412 s (choose 0.020 s, ...); first step 1.203 s``."""

    def s(key: str) -> str:
        value = breakdown.get(key)
        return "?" if value is None else f"{value:.3f} s"

    parts = [f"{s('import_s')} from process start to restart()"]
    if breakdown.get("restore_s") is not None:
        parts.append(f"restore {s('restore_s')} (choose {s('choose_s')}, verify {s('verify_s')}, read {s('read_s')})")
    parts.append(f"first step {s('first_step_s')}")
    return "; ".join(parts)


def seconds_since_process_start() -> float | None:
    """Seconds from this process's start (the operating system's word) to now; None where it is not known."""
    started = process_start_time()
    return round(max(0.0, time.time() - started), 3) if started is not None else None


def _hook_failures() -> None:
    """Chain ``sys.excepthook``: an uncaught exception after ``restart()`` appends a ``failure`` record."""
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        try:
            _record_failure(kind, value)
        except Exception:  # noqa: BLE001, S110 - best effort: the exception's own report comes next
            pass
        previous(kind, value, tb)

    sys.excepthook = hook


def _record_failure(kind: type, value: BaseException) -> None:
    if issubclass(kind, KeyboardInterrupt):
        return
    message = str(value).strip().splitlines()
    record_failure((f"{kind.__name__}: {message[0]}" if message else kind.__name__)[:500])


def record_failure(error: str, phase: str | None = None) -> None:
    """This process's start failed (an uncaught error; the watchdog's ``"hang"``): a ``failure`` record of its
    ``restart`` record (written first if it was held back), through the history (the primary, both tiers).
    ``phase``: where it failed (default: ``step`` once a step ended, else ``start``)."""
    if not _START:
        return
    start = _START[0]
    if start.history is None or start.record is None:
        return
    if not start.written:
        start.written = True
        start.history.append({**start.record, "start": dict(start.breakdown)})
    phase = phase or ("step" if start.stepped else "start")
    record = H.new_record("failure", restart=start.record["id"], error=error, phase=phase, process=process_token())
    start.history.append(record)
