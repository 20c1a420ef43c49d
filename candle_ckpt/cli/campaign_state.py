"""The rules of ``candle-ckpt campaign``: one run's state, its counts, and the campaign's summary. No I/O.

What a rule sees of a run (:class:`RunFacts`) is what the reader (:mod:`candle_ckpt.cli.campaign`) took from
its newest sidecars and its restart history (:mod:`candle_ckpt.core.history`), and, on a fast tier, the tail
of its ``ckpt.log``. The states, first match wins:

1. ``refused``: the newest of the run's ``restart`` / ``refused`` records is a ``refused`` (``restart()``
   refused a crash loop) and nothing was committed after it; or the drain refused the persistent tier for
   another lineage (``LineageConflict``, written to ``ckpt.log`` as "refusing to overwrite it") after the
   run's newest restart.
2. ``done``: the newest epoch checkpoint ends the run: its ``reason`` is ``final``, its epoch has reached
   the job's epoch limit (``extra["epochs"]``, ``gParameters["epochs"]``), or a callback ended the run
   there (``extra["finished"]``: ``EarlyStopping``).
3. ``failed``: the newest record is a ``failure`` (an uncaught error, or the watchdog's ``hang``), after the
   newest commit, and no restart came after it.
4. ``preempted``: the newest checkpoint is a preemption save (its ``reason`` is a signal, ``deadline`` or
   another forced reason) and no restart came after it: the run waits to be requeued.
5. ``stale``: nothing for longer than the run's own threshold: ``max(floor, factor x epoch time)``, where the
   epoch time is the newest checkpoint's ``time_elapsed`` (training seconds, summed over the run's lives)
   over its completed epochs, and the clock starts at the newest commit or restart, whichever is later.
6. ``moved``: training, and its newest restart landed on another host than the restart before it.
7. ``training``: anything else.
"""

from __future__ import annotations

import datetime
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from candle_ckpt.core.log import position

STATES = ("done", "training", "moved", "preempted", "failed", "stale", "refused")
#: The reasons of the saves a run makes on its own; any other reason is a forced save (a preemption).
ROUTINE_REASONS = frozenset({"", "best", "final", "interval", "init", "steps", "candle"})
STALE_FACTOR = 3.0
STALE_FLOOR_S = 300.0
SORT_KEYS = ("run", "state", "age", "epoch", "best", "restarts", "moves")


@dataclass(frozen=True)
class Commit:
    """What the rules read of a run's newest checkpoint (an epoch's or a step's)."""

    epoch: int
    generation: int
    time: float | None  # Unix seconds, from the sidecar's timestamp
    reason: str = ""
    step: int | None = None
    time_elapsed: float = 0.0
    metric: str | None = None
    best: float | None = None
    best_epoch: int | None = None
    mode: str | None = None
    limit: int | None = None  # the job's epoch limit, extra["epochs"]
    finished: bool = False  # extra["finished"]: a callback ended the run here
    drain_lag_s: float | None = None  # the newest recorded drain's lag behind its commit


@dataclass
class RunFacts:
    """One run as the reader found it."""

    run: str
    path: str
    tier: str  # "persistent" or "fast"
    newest: Commit | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    lineage_refusal: str | None = None  # ckpt.log's line, when the drain refused after the newest restart
    seen: float | None = None  # when anything of the run was last written (a directory's mtime), else None
    problems: list[str] = field(default_factory=list)


def parse_timestamp(stamp: str | None) -> float | None:
    """A sidecar's ``timestamp`` (``%Y-%m-%dT%H:%M:%S%z``) in Unix seconds, or None if absent or malformed."""
    if not stamp:
        return None
    try:
        return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def restarts_and_moves(history: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """Restarts (the ``restart`` records that resumed a checkpoint) and moves (those on another host than the start
    before them). A fresh start is recorded on the persistent tier only (``engine/restart_history.py``), and a job
    started afresh again after a refusal or by hand is a start, not a restart."""
    starts = [r for r in history if r.get("event") == "restart"]
    restarts = sum(1 for r in starts if r.get("resumed") is not None)
    moves = sum(
        1 for before, after in zip(starts, starts[1:], strict=False)
        if after.get("resumed") is not None and after.get("host") != before.get("host")
    )  # fmt: skip
    return restarts, moves


def epoch_time(newest: Commit | None) -> float | None:
    """The run's own seconds per epoch: training time over completed epochs (None before the first epoch)."""
    if newest is None or newest.epoch < 1 or newest.time_elapsed <= 0:
        return None
    return newest.time_elapsed / newest.epoch


def stale_after(newest: Commit | None, factor: float = STALE_FACTOR, floor: float = STALE_FLOOR_S) -> float:
    """Seconds without a commit or a restart after which a run is stale."""
    per_epoch = epoch_time(newest)
    return max(floor, factor * per_epoch) if per_epoch is not None else floor


def last_activity(facts: RunFacts) -> float | None:
    """When the run last did something: its newest commit or restart record, else its files' newest mtime."""
    times = [facts.newest.time] if facts.newest is not None and facts.newest.time is not None else []
    times += [float(r["time"]) for r in facts.history if r.get("event") == "restart"]
    if not times and facts.seen is not None:
        times.append(facts.seen)
    return max(times) if times else None


def _after(record: Mapping[str, Any], newest: Commit | None) -> bool:
    """Whether ``record`` came after the newest commit (all records do when nothing is committed)."""
    return newest is None or newest.time is None or float(record["time"]) >= newest.time


def _ends_run(newest: Commit | None) -> str | None:
    if newest is None or newest.step is not None:
        return None
    if newest.reason == "final":
        return f"epoch {newest.epoch} was saved as the final one"
    if newest.limit is not None and newest.epoch >= newest.limit:
        return f"epoch {newest.epoch} reached the job's epochs={newest.limit}"
    if newest.finished:
        return f"a callback ended the run after epoch {newest.epoch}"
    return None


def classify(
    facts: RunFacts, now: float, factor: float = STALE_FACTOR, floor: float = STALE_FLOOR_S
) -> tuple[str, str]:
    """``(state, why)`` of one run at ``now`` (see the module's docstring for the order of the rules)."""
    newest, history = facts.newest, facts.history
    marks = [r for r in history if r.get("event") in ("restart", "refused")]
    if marks and marks[-1]["event"] == "refused" and _after(marks[-1], newest):
        loop = marks[-1]
        what = f"{loop.get('resumed') or 'no checkpoint'} resumed {loop.get('count', '?')} times without progress"
        return "refused", f"restart() refused a crash loop: {what}"
    if facts.lineage_refusal:
        return "refused", f"the drain refused the persistent tier: {facts.lineage_refusal}"
    done = _ends_run(newest)
    if done:
        return "done", done
    if history and history[-1].get("event") == "failure" and _after(history[-1], newest):
        return "failed", f"the process failed: {history[-1].get('error') or 'an error with no message'}"
    restarted_since = bool(marks) and marks[-1]["event"] == "restart" and _after(marks[-1], newest)
    if newest is not None and newest.reason not in ROUTINE_REASONS and not restarted_since:
        return "preempted", f"its newest checkpoint is a {newest.reason} save; not restarted since"
    active = last_activity(facts)
    limit = stale_after(newest, factor, floor)
    if active is not None and now - active > limit:
        return "stale", f"nothing committed or restarted for {fmt_age(now - active)} (stale after {fmt_age(limit)})"
    restarts = [r for r in history if r.get("event") == "restart"]
    if len(restarts) >= 2 and restarts[-1].get("host") != restarts[-2].get("host"):
        return "moved", f"restarted on {restarts[-1].get('host')} (before: {restarts[-2].get('host')})"
    return "training", "committing"


def fmt_age(seconds: float | None) -> str:
    """``H:MM:SS`` (hours grow past 24): one shape whatever the age, so that columns and examples stay aligned."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    total = max(int(round(seconds)), 0)
    return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"


def row(facts: RunFacts, now: float, factor: float = STALE_FACTOR, floor: float = STALE_FLOOR_S) -> dict[str, Any]:
    """The JSON-ready row of one run (what the table, ``--json`` and the HTML page show)."""
    state, why = classify(facts, now, factor, floor)
    restarts, moves = restarts_and_moves(facts.history)
    n = facts.newest
    age = now - n.time if n is not None and n.time is not None else None
    return {
        "run": facts.run,
        "path": facts.path,
        "tier": facts.tier,
        "state": state,
        "why": why,
        "epoch": n.epoch if n else None,
        "step": n.step if n else None,
        "generation": n.generation if n else None,
        "committed": n.time if n else None,
        "age_s": round(age, 3) if age is not None else None,
        "stale_after_s": round(stale_after(n, factor, floor), 3),
        "restarts": restarts,
        "moves": moves,
        "metric": n.metric if n else None,
        "mode": n.mode if n else None,
        "best": n.best if n else None,
        "best_epoch": n.best_epoch if n else None,
        "epochs": n.limit if n else None,
        "drain_lag_s": n.drain_lag_s if n else None,
        "problems": list(facts.problems),
    }


def best_row(rows: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The run with the best value of the campaign's monitored metric (the one most runs monitor), by its mode."""
    scored = [r for r in rows if r.get("metric") and isinstance(r.get("best"), (int, float))]
    if not scored:
        return None
    metric = Counter(r["metric"] for r in scored).most_common(1)[0][0]
    same = [r for r in scored if r["metric"] == metric]
    sign = -1.0 if (same[0].get("mode") or "min") == "max" else 1.0
    return min(same, key=lambda r: (sign * float(r["best"]), r["run"]))


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The campaign at a glance: the runs in each state, and the best run."""
    counts = Counter(r["state"] for r in rows)
    best = best_row(rows)
    return {
        "runs": len(rows),
        "states": {s: counts.get(s, 0) for s in STATES},
        "best": {k: best[k] for k in ("run", "metric", "best", "best_epoch")} if best else None,
    }


def summary_line(info: Mapping[str, Any]) -> str:
    """``3 runs: 2 done, 0 training, 0 stale, 0 refused (1 preempted); best val_loss 0.31 in run-0002 at epoch 4``."""
    states = info["states"]
    line = f"{info['runs']} run{'' if info['runs'] == 1 else 's'}: " + ", ".join(
        f"{states[s]} {s}" for s in ("done", "training", "stale", "refused")
    )
    others = [f"{states[s]} {s}" for s in ("moved", "preempted", "failed") if states[s]]
    if others:
        line += f" ({', '.join(others)})"
    best = info["best"]
    if best is None:
        return line + "; no monitored metric"
    return line + f"; best {best['metric']} {best['best']:.6g} in {best['run']} at epoch {best['best_epoch']}"


def sort_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """``rows`` by ``key`` (:data:`SORT_KEYS`); ``best`` puts the best first (by each run's mode), then the rest."""
    if key == "state":
        return sorted(rows, key=lambda r: (STATES.index(r["state"]), r["run"]))
    if key == "age":
        return sorted(rows, key=lambda r: (r["age_s"] is None, -(r["age_s"] or 0.0), r["run"]))
    if key == "best":
        return sorted(rows, key=_best_key)
    if key in ("epoch", "restarts", "moves"):
        return sorted(rows, key=lambda r: (r[key] is None, -(r[key] or 0), r["run"]))
    return sorted(rows, key=lambda r: r["run"])


def _best_key(r: Mapping[str, Any]) -> tuple[bool, float, str]:
    value = r.get("best")
    if not isinstance(value, (int, float)):
        return True, 0.0, r["run"]
    return False, -float(value) if r.get("mode") == "max" else float(value), r["run"]


def fmt_newest(r: dict[str, Any]) -> str:
    """A row's newest checkpoint as ``list`` names it: ``epoch 4``, or ``epoch 3, step 3`` (Keras's 1-based epochs)."""
    return "-" if r["epoch"] is None else position(r["epoch"], r["step"])


def table_cells(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The table's header and cells (the terminal's table and the page's)."""
    metrics = {r["metric"] for r in rows if r["metric"]}
    one = next(iter(metrics)) if len(metrics) == 1 else None
    header = ["RUN", "STATE", "NEWEST", "GEN", "AGE", "RESTARTS", "MOVES", f"BEST {one}" if one else "BEST"]
    header += ["AT", "DRAIN"]
    cells = []
    for r in rows:
        best = "-" if r["best"] is None else f"{r['best']:.6g}"
        if one is None and r["best"] is not None:
            best = f"{r['metric']}={best}"
        cells.append(
            [
                r["run"],
                r["state"],
                fmt_newest(r),
                "-" if r["generation"] is None else str(r["generation"]),
                fmt_age(r["age_s"]),
                str(r["restarts"]),
                str(r["moves"]),
                best,
                "-" if r["best_epoch"] is None else str(r["best_epoch"]),
                "-" if r["drain_lag_s"] is None else f"{r['drain_lag_s']:.2f} s",
            ]
        )
    return header, cells


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The terminal's table: the header and one line per row, columns aligned."""
    if not rows:
        return ["no run to show"]
    header, cells = table_cells(rows)
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *cells]]
