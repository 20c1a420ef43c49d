"""The ``candle-ckpt`` commands: list, verify, info, rollback and plot (prune: :mod:`candle_ckpt.cli.prune`).

Every command goes through :class:`~candle_ckpt.storage.store.CheckpointStore` (layout,
sidecars, CRC checks, links, locking) and the keep policies of
:mod:`candle_ckpt.core.policy`, so the tool and the training callback cannot disagree
about what a checkpoint is. Each returns the exit code or raises :class:`CliError`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from candle_ckpt.cli.common import (
    EXIT_CORRUPT,
    EXIT_OK,
    PROG,
    CliError,
    epoch_ranges,
    fmt_bytes,
    fmt_time,
    fmt_value,
    marks_of,
    monitored,
    open_store,
    oplog,
    problem,
    progress_factory,
    read_links,
    read_sidecar,
    resolve_epoch,
    verify_with_bar,
)
from candle_ckpt.cli.steps import print_step_rows, step_rows, verify_steps
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint
from candle_ckpt.core.log import counted
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.lineage import abandoned_epochs
from candle_ckpt.storage.store import CheckpointStore, Rollback

# -- list -----------------------------------------------------------------------------------


def _rows(store: CheckpointStore, links: dict[str, int | None], verify: bool) -> list[dict[str, Any]]:
    bar_factory = progress_factory() if verify else None
    abandoned = set(abandoned_epochs(store, links["last"]))
    rows = []
    for epoch in store.epochs():
        row: dict[str, Any] = {
            "epoch": epoch,
            "path": store.layout.epoch_dir(epoch),
            "best": links["best"] == epoch,
            "last": links["last"] == epoch,
            "abandoned": epoch in abandoned,
            "verified": verify,
            "valid": False,
            "problem": None,
            "timestamp": None,
            "bytes": None,
            "metric": None,
            "metric_value": None,
            "reason": None,
            "generation": None,
        }
        rows.append(row)
        try:
            side = store.read_sidecar(epoch)
        except CheckpointError as err:
            row["problem"] = problem(err)
            continue
        metric, value = monitored(side)
        row.update(
            timestamp=side.timestamp,
            bytes=side.total_bytes,
            metric=metric,
            metric_value=value,
            reason=side.reason,
            generation=side.generation,
        )
        if verify:
            try:
                verify_with_bar(store, epoch, bar_factory)
            except CheckpointError as err:
                row["problem"] = problem(err)
                continue
        row["valid"] = True
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    store = open_store(args.dir)
    pointers = read_links(store)
    rows = _rows(store, pointers, args.verify)
    steps = step_rows(store, args.verify)
    failed = args.verify and any(not r["valid"] for r in rows + steps)
    if args.json:
        out = {"directory": store.layout.root, "best": pointers["best"], "last": pointers["last"], "checkpoints": rows}
        out["steps"] = steps
        print(json.dumps(out, indent=2, default=str))
        return EXIT_CORRUPT if failed else EXIT_OK
    if not rows and not steps:
        print(f"no checkpoints in {store.layout.root}")
        return EXIT_OK
    table = [("EPOCH", "SAVED", "SIZE", "METRIC", "REASON", "MARK", "CRC" if args.verify else "SIDECAR")]
    for r in rows:
        metric = f"{r['metric']}={fmt_value(r['metric_value'])}" if r["metric"] else "-"
        table.append(
            (
                L.epoch_name(r["epoch"]),
                fmt_time(r["timestamp"]),
                fmt_bytes(r["bytes"]) if r["bytes"] is not None else "-",
                metric,
                r["reason"] or "-",
                ",".join(n for n in (*L.LINK_NAMES, "abandoned") if r[n]) or "-",
                "ok" if r["valid"] else f"INVALID: {r['problem']}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    total = sum(r.get("bytes") or 0 for r in rows)
    where = ", ".join(f"{n} -> {L.epoch_name(e) if e is not None else 'none'}" for n, e in pointers.items())
    print(f"{counted(len(rows), 'checkpoint')}, {fmt_bytes(total)}; {where}")
    abandoned = [r["epoch"] for r in rows if r["abandoned"]]
    if abandoned:
        print(
            f"{counted(len(abandoned), 'checkpoint')} ({epoch_ranges(abandoned)}) of a lineage a rollback abandoned: "
            f"not on the way to last, never restored; {PROG} prune {args.dir} --abandoned removes them"
        )
    print_step_rows(steps, args.verify)
    if not args.verify:
        print("(read from the sidecars only; add --verify to check every file's CRC32)")
    return EXIT_CORRUPT if failed else EXIT_OK


# -- verify ---------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    store = open_store(args.dir)
    # Every checkpoint on disk is checked; those of a lineage a rollback abandoned are checked too, and named.
    abandoned = set(abandoned_epochs(store, store.link_epoch("last")))
    epochs = [resolve_epoch(store, args.epoch)] if args.epoch is not None else store.epochs()
    with_steps = args.epoch is None and bool(store.steps.generations())
    if not epochs and not with_steps:
        print(f"no checkpoints in {store.layout.root}")
        return EXIT_OK
    bar_factory = progress_factory()
    failures = []
    for epoch in epochs:
        mark = "  (abandoned by a rollback)" if epoch in abandoned else ""
        try:
            side = verify_with_bar(store, epoch, bar_factory)
        except CheckpointError as err:
            where = f"{err.path}: {err.reason}" if isinstance(err, CorruptCheckpoint) else str(err)
            failures.append(f"epoch {epoch}: {where}")
            print(f"epoch {L.epoch_name(epoch)}: FAILED  {where}{mark}", flush=True)
            continue
        unchecked = [n for n, e in side.files.items() if e.crc32 is None]
        how = "sizes only (saved with ckpt_checksum off)" if unchecked else "CRC32 ok"
        files = counted(len(side.files), "file")
        print(f"epoch {L.epoch_name(epoch)}: ok  {files}, {fmt_bytes(side.total_bytes)}, {how}{mark}")
    count = len(epochs)
    if with_steps:
        failures += verify_steps(store)
        count += len(store.steps.generations())
    if abandoned and args.epoch is None:
        were = "was" if len(abandoned) == 1 else "were"
        print(
            f"{counted(len(abandoned), 'checkpoint')} ({epoch_ranges(abandoned)}) of a lineage a rollback abandoned "
            f"{were} checked too: not on the way to last, never restored; {PROG} prune {args.dir} --abandoned "
            "removes them"
        )
    if failures:
        print(f"{len(failures)} of {counted(count, 'checkpoint')} FAILED verification")
        raise CliError(f"verification failed: {'; '.join(failures)}", code=EXIT_CORRUPT)
    print(f"all {count} checkpoints verified" if count > 1 else "checkpoint verified")
    return EXIT_OK


# -- info -----------------------------------------------------------------------------------


def _pretty(side: Sidecar, width: int = 18) -> list[str]:
    lines = []
    for f in dataclasses.fields(side):
        value = getattr(side, f.name)
        if f.name == "files":
            lines.append("files")
            column = max([width - 2, *map(len, value)])  # a sharded checkpoint's train.state.pRRRRR.npz is longer
            for name, entry in sorted(value.items()):
                crc = entry.crc32 or "(no CRC)"
                lines.append(f"  {name.ljust(column)} {fmt_bytes(entry.size):>10}  crc32 {crc}")
        elif isinstance(value, dict):
            lines.append(f.name if value else f"{f.name.ljust(width)} (empty)")
            for key in sorted(value):
                lines.append(f"  {str(key).ljust(width - 2)} {fmt_value(value[key])}")
        else:
            lines.append(f"{f.name.ljust(width)} {fmt_value(value)}")
    lines.append(f"{'checksum'.ljust(width)} {fmt_value(side.checksum)}")
    lines.append(f"{'total size'.ljust(width)} {fmt_bytes(side.total_bytes)}")
    return lines


def cmd_info(args: argparse.Namespace) -> int:
    store = open_store(args.dir)
    epoch = resolve_epoch(store, args.epoch)
    side = read_sidecar(store, epoch)
    if args.json:
        print(json.dumps(side.to_dict(), indent=2, sort_keys=True, default=str))
        return EXIT_OK
    tags = marks_of(epoch, read_links(store))
    print(f"checkpoint {store.layout.epoch_dir(epoch)}" + (f"  [{', '.join(tags)}]" if tags else ""))
    for line in _pretty(side):
        print(f"  {line}")
    return EXIT_OK


# -- rollback -------------------------------------------------------------------------------


def cmd_rollback(args: argparse.Namespace) -> int:
    store = open_store(args.dir)
    epoch = resolve_epoch(store, args.epoch)
    # Lock first: no job may commit or prune between the check and the re-pointing.
    store.open_for_write()
    try:
        done = store.rollback(epoch)
    except CheckpointError as err:
        raise CliError(f"refusing to roll back to epoch {epoch}: {err}", code=EXIT_CORRUPT) from None
    finally:
        store.close()
    log = oplog(store)
    was = L.link_target(done.last_before) if done.last_before is not None else "nothing"
    log.info(f"rollback: 'last' re-pointed from {was} to {L.link_target(epoch)} by {PROG}")
    if done.dropped:
        names = ", ".join(L.step_name(g) for g in done.dropped)
        log.info(f"rollback: removed the step checkpoints {names} (mid-epoch, after the rollback point)")
        print(f"removed the step checkpoints {names}: they continued the run rolled back from")
    print(f"last -> {L.link_target(epoch)} (was {was}); checkpoint verified")
    if done.had_best:
        line = _best_line(done)
        print(line)
        log.info(f"rollback: {line} by {PROG}")
    print(f"the next restart() resumes after epoch {epoch}")
    return EXIT_OK


def _best_line(done: Rollback) -> str:
    """Where ``best`` went: the best checkpoint of the current lineage, or nowhere (docs/cli.rst, ``rollback``)."""
    best, before = done.best, done.best_before
    was = L.link_target(before) if before is not None else "a bad link"
    lineage = f"the current lineage (epochs {epoch_ranges(best.lineage)})"
    if best.epoch is None:
        what = best.metric or "a monitored metric"
        return f"best removed (was {was}): no checkpoint of {lineage} records {what}"
    how = "unchanged" if best.epoch == before else f"was {was}"
    word = "lowest" if best.mode == "min" else "highest"
    return f"best -> {L.link_target(best.epoch)} ({how}): the {word} {best.metric} of {lineage}"


# -- plot -----------------------------------------------------------------------------------


def cmd_plot(args: argparse.Namespace) -> int:
    from candle_ckpt.cli.plotting import plot_history, require_matplotlib
    from candle_ckpt.core.errors import MissingDependency

    try:
        require_matplotlib()  # one line naming the pip command, before any work
    except MissingDependency as err:
        raise CliError(str(err)) from None
    store = open_store(args.dir)
    sides: dict[int, Sidecar] = {}
    for epoch in store.epochs():
        try:
            sides[epoch] = store.read_sidecar(epoch)
        except CorruptCheckpoint as err:
            print(f"{PROG} plot: warning: skipping epoch {epoch}: {err.path}: {err.reason}", file=sys.stderr)
    out = os.path.abspath(args.output)
    if not os.path.isdir(os.path.dirname(out)):
        raise CliError(f"-o {args.output}: directory {os.path.dirname(out)} does not exist")
    pointers = read_links(store)
    try:
        n = plot_history(
            sides, best=pointers["best"], last=pointers["last"], title=store.layout.root, path=out, dpi=args.dpi
        )
    except ValueError as err:
        raise CliError(f"cannot plot {store.layout.root}: {err}") from None
    print(f"wrote {out}: {counted(n, 'metric')} over {counted(len(sides), 'checkpoint')}")
    return EXIT_OK
