"""``candle-ckpt prune``: apply a keep policy to a checkpoint directory, or show what it would remove.

Like the training callback it goes through :meth:`CheckpointStore.prune` (best and last are always
kept; after a rollback the current lineage is retained first) and refuses while a job writes to the directory.
"""

from __future__ import annotations

import argparse
from typing import Any

from candle_ckpt.cli.common import (
    EXIT_OK,
    PROG,
    epoch_ranges,
    fmt_bytes,
    marks_of,
    open_store,
    oplog,
    read_links,
)
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError
from candle_ckpt.core.log import counted
from candle_ckpt.core.retention import retention_policy
from candle_ckpt.storage.lineage import abandoned_epochs
from candle_ckpt.storage.store import CheckpointStore


class Abandoned:
    """``prune --abandoned``: keep the current lineage (and every checkpoint not known to be abandoned)."""

    def __init__(self, abandoned: list[int]) -> None:
        self.abandoned = set(abandoned)

    def select(self, epochs: set[int], protected: tuple[int, ...]) -> set[int]:
        return set(epochs) - self.abandoned

    def __repr__(self) -> str:
        return f"the checkpoints a rollback abandoned: epochs {epoch_ranges(self.abandoned)}"


def cmd_prune(args: argparse.Namespace) -> int:
    store = open_store(args.dir)
    if not args.dry_run:
        store.open_for_write()  # refuses while a job writes to the directory, before printing anything
    try:
        pointers = read_links(store)  # under the lock: no job moves 'last' meanwhile
        abandoned = abandoned_epochs(store, pointers["last"])
        if args.abandoned:
            policy: Any = Abandoned(abandoned)
        else:
            policy = retention_policy(args.keep_mode, args.keep_limit)
        return _prune(store, policy, pointers, args, abandoned)
    finally:
        store.close()


def _prune(
    store: CheckpointStore, policy: Any, pointers: dict[str, int | None], args: argparse.Namespace, abandoned: list[int]
) -> int:
    sizes = {}
    for epoch in store.epochs():
        try:
            sizes[epoch] = store.read_sidecar(epoch).total_bytes
        except CheckpointError:
            sizes[epoch] = None

    def describe(epoch: int) -> str:
        tags = marks_of(epoch, pointers)
        return f"{L.link_target(epoch)}  {fmt_bytes(sizes.get(epoch))}" + (f"  ({', '.join(tags)})" if tags else "")

    rule = f"keep_mode {args.keep_mode}, keep_limit {args.keep_limit}" if not args.abandoned else "abandoned"
    print(f"{rule} ({policy!r}); best and last are always kept")
    if abandoned and not args.abandoned:
        print(
            f"the current lineage first: {counted(len(abandoned), 'checkpoint')} ({epoch_ranges(abandoned)}) of a "
            "lineage a rollback abandoned rank below it"
        )
    by_lineage = not args.abandoned  # --abandoned is a rule about the lineage itself
    keep, doomed = store.prune_plan(policy.select, lineage_first=by_lineage)
    if not args.dry_run:
        doomed = store.prune(policy.select, lineage_first=by_lineage)
    for epoch in keep:
        print(f"keep          {describe(epoch)}")
    verb = "would remove" if args.dry_run else "removed"
    for epoch in doomed:
        print(f"{verb.ljust(13)} {describe(epoch)}")
    freed = sum(sizes.get(e) or 0 for e in doomed)
    of = counted(len(keep) + len(doomed), "checkpoint")
    if args.dry_run:
        print(f"dry run: would remove {len(doomed)} of {of} ({fmt_bytes(freed)})")
    else:
        print(f"pruned {len(doomed)} of {of} ({fmt_bytes(freed)} freed)")
        if doomed:
            oplog(store).info(f"pruned epochs {epoch_ranges(doomed)} by {PROG} ({rule})")
    return EXIT_OK
