"""What every ``candle-ckpt`` command shares: exit codes, the one-line error, opening a
directory, resolving an epoch, and formatting sizes, values and epoch lists."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from candle_ckpt.cli.console import EXIT_CORRUPT, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, PROG  # noqa: F401 (re-exported: defined beside the Ctrl-C answer, which imports lightly)
from candle_ckpt.core import layout as L
from candle_ckpt.core.errors import CheckpointError, CorruptCheckpoint
from candle_ckpt.core.log import OpsLog, human_bytes
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.store import CheckpointStore

DEBUG_ENV = "CANDLE_CKPT_DEBUG"


class CliError(Exception):
    """A problem reported as one line on stderr with exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def open_store(directory: str) -> CheckpointStore:
    """Return the store of ``directory``, or fail if it is not a checkpoint directory."""
    store = CheckpointStore(directory)
    flat = CheckpointStore(directory, flat=True)
    parent = os.path.dirname(flat.layout.root)
    if not store.exists() and flat.exists() and not (L.Layout.at(parent).ckpts == flat.layout.root):
        store = flat  # the flat layout (candle_lib develop): epochs/ right here (a ".../ckpts" gets the hint below)
    root = store.layout.root
    if os.path.lexists(root) and not os.path.isdir(root):
        raise CliError(f"{directory} is a file, not a checkpoint directory")
    if not os.path.isdir(root):
        raise CliError(f"{directory}: no such directory")
    if not store.exists():
        hint = ""
        parent = os.path.dirname(root)
        if L.Layout.at(parent).ckpts == root and CheckpointStore(parent).exists():
            hint = f"; did you mean {parent} (the job's ckpt_directory)?"
        raise CliError(f"{directory} is not a checkpoint directory: {store.layout.epochs} does not exist{hint}")
    return store


def epoch_ranges(epochs: Iterable[int]) -> str:
    """``1, 2, 3, 5, 7, 8`` as ``1-3, 5, 7-8``: a long list of epochs stays one short line."""
    runs: list[list[int]] = []
    for epoch in sorted(set(epochs)):
        if runs and epoch == runs[-1][1] + 1:
            runs[-1][1] = epoch
        else:
            runs.append([epoch, epoch])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def resolve_epoch(store: CheckpointStore, wanted: int | str) -> int:
    """Turn an epoch number or ``best``/``last`` into an epoch that exists on disk."""
    epochs = store.epochs()
    have = epoch_ranges(epochs)
    if isinstance(wanted, str):
        epoch = store.link_epoch(wanted)
        if epoch is None:
            raise CliError(f"{store.layout.link(wanted)} is missing; give an epoch number (epochs on disk: {have})")
        if epoch not in epochs:
            raise CliError(f"'{wanted}' points to {store.layout.epoch_dir(epoch)}, which does not exist")
        return epoch
    if wanted not in epochs:
        raise CliError(f"no checkpoint for epoch {wanted} in {store.layout.root} (epochs on disk: {have})")
    return wanted


def read_sidecar(store: CheckpointStore, epoch: int) -> Sidecar:
    try:
        return store.read_sidecar(epoch)
    except CorruptCheckpoint as err:
        raise CliError(f"{err.path}: {err.reason}") from None


def read_links(store: CheckpointStore) -> dict[str, int | None]:
    return {name: store.link_epoch(name) for name in L.LINK_NAMES}


def marks_of(epoch: int, pointers: dict[str, int | None]) -> list[str]:
    return [name for name in L.LINK_NAMES if pointers[name] == epoch]


fmt_bytes = human_bytes


def fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def fmt_time(stamp: str | None) -> str:
    # Sidecars store "%Y-%m-%dT%H:%M:%S%z" in the writer's local time; the table drops the offset.
    return stamp[:19].replace("T", " ") if stamp else "-"


def monitored(side: Sidecar) -> tuple[str | None, Any]:
    metric = side.save_best_metric
    return metric, side.logs.get(metric) if metric else None


def problem(err: CheckpointError) -> str:
    if isinstance(err, CorruptCheckpoint):
        return f"{os.path.basename(err.path)}: {err.reason}"
    return str(err)


def progress_factory() -> Callable[..., Any] | None:
    """A tqdm constructor when stdout is a terminal; None otherwise (pipes, files, CI logs)."""
    if not sys.stdout.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety; verification works without it
        return None

    def bar(total: int, desc: str) -> Any:
        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False, file=sys.stdout)

    return bar


def verify_with_bar(store: CheckpointStore, epoch: int, bar_factory: Callable[..., Any] | None) -> Sidecar:
    """``store.verify`` with a byte progress bar when one is wanted."""
    if bar_factory is None:
        return store.verify(epoch)[0]
    total = store.read_sidecar(epoch).total_bytes
    bar = bar_factory(total=total, desc=f"epoch {L.epoch_name(epoch)}")
    try:
        return store.verify(epoch, progress=bar.update)[0]
    finally:
        bar.close()


def oplog(store: CheckpointStore) -> OpsLog:
    return OpsLog(store.layout.log, None)
