"""``candle-ckpt prune``: apply a keep policy to a checkpoint directory, or show what it would remove.

Like the training callback it goes through :meth:`CheckpointStore.prune` (best and last are always
kept) and refuses while a job writes to the directory.
"""

from __future__ import annotations

import argparse
from typing import Any

from candle_ckpt.cli.common import (
    EXIT_OK,
    PROG,
    abandoned_epochs,
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
        if args.abandoned:
            policy: Any = Abandoned(abandoned_epochs(store, pointers["last"]))
        else:
            policy = retention_policy(args.keep_mode, args.keep_limit)
        return _prune(store, policy, pointers, args)
    finally:
        store.close()


def _prune(store: CheckpointStore, policy: Any, pointers: dict[str, int | None], args: argparse.Namespace) -> int:
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
    keep, doomed = store.prune_plan(policy.select)
    if not args.dry_run:
        doomed = store.prune(policy.select)
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
