"""The pure parts of the goodput benchmark: the seeded schedules, the split of lost time, the goodput model.

Imported by ``bench_goodput.py`` (run that one) and by ``tests/unit/test_bench_goodput.py``; no Keras, no JAX.

A run is a list of *processes* (one per launch of the job until it completes). Each process is a dict of
wall-clock times (``time.time()``) and counts:

- ``launch``: when the harness started it; ``exit``: when it ended;
- ``t0`` (the job's first line, before any import), ``built`` (model built and compiled: the restore begins),
  ``restored`` (the restore done), ``first`` (the end of its first train batch: the compile included);
- ``resumed``: the optimizer step it resumed at (0: from scratch); ``steps``: ``[[time, step], ...]`` at every
  train batch end; ``signal_at``: when the harness signalled it (None: it was not interrupted).
"""

from __future__ import annotations

import random
import statistics
from typing import Any

# Schedule (A): every 10-20 s a SIGTERM (10 s of grace, then SIGKILL) or a SIGKILL, at even odds.
# Schedule (B): a SIGKILL every 30-90 s (node failures on long epochs).
SCHEDULES = {
    "A": {"every_s": (10.0, 20.0), "sigterm_odds": 0.5, "epochs": 60, "epoch_s": 2.0},
    "B": {"every_s": (30.0, 90.0), "sigterm_odds": 0.0, "epochs": 10, "epoch_s": 20.0},
}
GRACE_S = 10.0  # after a SIGTERM, the SIGKILL follows this much later


def schedule(name: str, seed: int, count: int = 400) -> list[tuple[float, str]]:
    """The seeded list of interruptions ``(seconds after the launch, "TERM" | "KILL")``, the same for every contender.

    Args:
        name: ``"A"`` or ``"B"`` (see :data:`SCHEDULES`).
        seed: The seed; the same seed gives the same list.
        count: How many interruptions to draw (a run uses as many as it needs).

    Returns:
        One ``(interval_s, signal)`` per launch: launch ``i`` is interrupted ``interval_s`` after it starts.

    Raises:
        ValueError: ``name`` is not a schedule.
    """
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, not {name!r}")
    spec = SCHEDULES[name]
    rng = random.Random(f"{name}:{seed}")
    low, high = spec["every_s"]
    out = []
    for _ in range(count):
        interval = rng.uniform(low, high)
        kind = "TERM" if rng.random() < spec["sigterm_odds"] else "KILL"
        out.append((round(interval, 3), kind))
    return out


def step_time(processes: list[dict[str, Any]]) -> float:
    """The median time of one train step, from every process's batch ends after its first (the compile)."""
    gaps = []
    for p in processes:
        times = [t for t, _ in p.get("steps", [])]
        gaps += [b - a for a, b in zip(times[1:], times[2:], strict=False)]
    return statistics.median(gaps) if gaps else 0.0


def _time_at_step(p: dict[str, Any], step: int, step_s: float) -> float | None:
    """When process ``p`` had reached ``step`` steps (its last batch end at or below it; its own starting step one
    step time before its first batch end, the compile left out), or None when it reached none."""
    first = p.get("first")
    at = first - step_s if first is not None and p.get("resumed", 0) <= step else None
    for t, s in p.get("steps", []):
        if s <= step:
            at = t
        else:
            break
    return at


def start_parts(p: dict[str, Any], step_s: float) -> dict[str, float]:
    """A (re)started process's start: ``startup`` (launch to the restore's start), ``restore``, ``compile`` (the
    first step beyond one ordinary step). A process interrupted within a phase counts the phase up to its end."""
    end = p["exit"]
    built = p.get("built") or end
    restored = p.get("restored") or max(built, end)
    first = p.get("first")
    compile_s = max(0.0, first - restored - step_s) if first else max(0.0, end - restored)
    return {
        "startup": max(0.0, min(built, end) - p["launch"]),
        "restore": max(0.0, min(restored, end) - min(built, end)),
        "compile": compile_s,
    }


def lost_work(killed: dict[str, Any], resumed: int, step_s: float) -> tuple[float, int]:
    """The work of ``killed`` that the next process redid, which resumed at step ``resumed``: the seconds from the
    point it had reached that step to its interruption, and the steps it had made beyond it.

    When the next process resumed below where ``killed`` itself began (a checkpoint lost), all of ``killed``'s
    training is lost, and the steps between are redone too (at ``step_s`` each).
    """
    signal = killed.get("signal_at") or killed["exit"]
    steps = killed.get("steps", [])
    done = max([s for t, s in steps if t <= signal], default=killed.get("resumed", 0))
    start = killed.get("resumed", 0)
    if resumed >= start:
        at = _time_at_step(killed, resumed, step_s)
        if at is None:  # it had not finished its first step
            return 0.0, 0
        return max(0.0, signal - at), max(0, done - resumed)
    first = killed.get("first")
    trained = max(0.0, signal - first) if first and first < signal else 0.0
    return trained + (start - resumed) * step_s, max(0, done - resumed)


def split(processes: list[dict[str, Any]], uninterrupted_s: float) -> dict[str, Any]:
    """Goodput and the lost seconds of a run, per interruption: start-up, restore, compile, lost work and the rest.

    Args:
        processes: The run's processes in launch order (the last one completed the job).
        uninterrupted_s: The job's wall time without interruption and without checkpointing (launch to exit).

    Returns:
        ``wall_s``, ``goodput``, ``interruptions``, ``lost_s`` (wall minus uninterrupted), ``per_interruption``
        (mean seconds of each part and ``total``; ``other`` is what the parts do not explain: a SIGTERM's grace
        and the save in it, the process's exit, training slower than uninterrupted) and ``lost_steps``.
    """
    wall = processes[-1]["exit"] - processes[0]["launch"]
    n = len(processes) - 1
    step_s = step_time(processes)
    parts = {"startup": 0.0, "restore": 0.0, "compile": 0.0, "lost_work": 0.0}
    lost_steps = 0
    for killed, nxt in zip(processes, processes[1:], strict=False):
        for key, value in start_parts(nxt, step_s).items():
            parts[key] += value
        seconds, steps = lost_work(killed, nxt.get("resumed", 0), step_s)
        parts["lost_work"] += seconds
        lost_steps += steps
    lost = wall - uninterrupted_s
    per = {key: (value / n if n else 0.0) for key, value in parts.items()}
    per["other"] = (lost - sum(parts.values())) / n if n else 0.0
    per["total"] = lost / n if n else 0.0
    return {
        "wall_s": wall,
        "goodput": uninterrupted_s / wall if wall > 0 else 0.0,
        "interruptions": n,
        "lost_s": lost,
        "per_interruption": per,
        "lost_steps": lost_steps,
        "step_s": step_s,
    }


def modelled_goodput(mtbf_s: float, lost_per_interruption_s: float, overhead: float) -> float:
    """Goodput at a mean time between failures: ``(1 - overhead) * MTBF / (MTBF + L)``.

    Each failure costs ``L`` seconds (start-up, restore, compile and lost work, as measured); between failures
    training runs ``1 - overhead`` as fast as without checkpointing.
    """
    if mtbf_s <= 0:
        raise ValueError(f"mtbf_s must be > 0, not {mtbf_s}")
    return (1.0 - overhead) * mtbf_s / (mtbf_s + max(0.0, lost_per_interruption_s))
