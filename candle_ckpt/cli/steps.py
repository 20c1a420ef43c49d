"""Step (mid-epoch) checkpoints in ``candle-ckpt list``, ``verify`` and ``rollback``.

They live in ``ckpts/steps/GGG`` (see :mod:`candle_ckpt.storage.steps`); the
commands show them after the epoch checkpoints, marked with their epoch and step.
"""

from __future__ import annotations

from typing import Any

from candle_ckpt.cli.common import fmt_bytes, fmt_time, problem
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.log import counted, position
from candle_ckpt.storage.store import CheckpointStore


def step_rows(store: CheckpointStore, verify: bool) -> list[dict[str, Any]]:
    """One row per step checkpoint: generation, path, epoch, step, reason, size, validity."""
    rows = []
    for generation in store.steps.generations():
        row: dict[str, Any] = {
            "generation": generation,
            "path": store.layout.step_dir(generation),
            "epoch": None,
            "step": None,
            "timestamp": None,
            "bytes": None,
            "reason": None,
            "verified": verify,
            "valid": False,
            "problem": None,
        }
        rows.append(row)
        try:
            side = store.steps.verify(generation)[0] if verify else store.steps.read_sidecar(generation)
        except CheckpointError as err:
            row["problem"] = problem(err)
            continue
        row.update(
            epoch=side.epoch, step=side.step, timestamp=side.timestamp, bytes=side.total_bytes, reason=side.reason
        )
        row["valid"] = True
    return rows


def print_step_rows(rows: list[dict[str, Any]], verify: bool) -> None:
    """The step checkpoints as a table under the epoch table (nothing when there are none)."""
    if not rows:
        return
    table = [("STEP", "SAVED", "SIZE", "POSITION", "REASON", "CRC" if verify else "SIDECAR")]
    for r in rows:
        where = position(r["epoch"], r["step"]) if r["valid"] else "-"
        table.append(
            (
                L.step_name(r["generation"]),
                fmt_time(r["timestamp"]),
                fmt_bytes(r["bytes"]) if r["bytes"] is not None else "-",
                where,
                r["reason"] or "-",
                "ok" if r["valid"] else f"INVALID: {r['problem']}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    print()
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    print(f"{counted(len(rows), 'step checkpoint')}: mid-epoch; restart() prefers the newest one committed after last")


def verify_steps(store: CheckpointStore) -> list[str]:
    """Verify every step checkpoint, printing one line each; return the failures."""
    failures = []
    for row in step_rows(store, verify=True):
        name = L.step_name(row["generation"])
        if row["valid"]:
            print(f"{name}: ok  {position(row['epoch'], row['step'])}, {fmt_bytes(row['bytes'])}, CRC32 ok")
        else:
            failures.append(f"{name}: {row['problem']}")
            print(f"{name}: FAILED  {row['problem']}", flush=True)
    return failures
