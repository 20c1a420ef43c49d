"""``candle-ckpt``: list, verify, inspect, roll back, prune and plot a checkpoint directory.

Every command goes through :class:`~candle_ckpt.storage.store.CheckpointStore` (layout,
sidecars, CRC checks, links, locking) and the keep policies of
:mod:`candle_ckpt.core.policy`, so the tool and the training callback cannot
disagree about what a checkpoint is. Keras and TensorFlow are imported only by
``demo``; matplotlib only by ``plot``; tqdm only when a progress bar is shown.

Exit codes: 0 success; 1 corruption found (``verify``, ``list --verify``, or a
``rollback`` target that fails verification); 2 any other error (usage, not a
checkpoint directory, unknown epoch, unreadable sidecar, directory in use);
130 interrupted. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from candle_ckpt import __version__
from candle_ckpt.core import layout as L
from candle_ckpt.core.log import OpsLog
from candle_ckpt.core.policy import keep_policy
from candle_ckpt.core.sidecar import Sidecar
from candle_ckpt.storage.store import CheckpointError, CheckpointStore, CorruptCheckpoint

PROG = "candle-ckpt"
EXIT_OK, EXIT_CORRUPT, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
DEBUG_ENV = "CANDLE_CKPT_DEBUG"


class CliError(Exception):
    """A problem reported as one line on stderr with exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints usage + message)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


# -- argument types ---------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}")
    return value


def _epoch_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"an epoch must be an integer >= 0; got {text!r}")
    return value


def _epoch_or_link(text: str) -> int | str:
    return text if text in L.LINK_NAMES else _epoch_arg(text)


# -- helpers ------------------------------------------------------------------------------


def _open_store(directory: str) -> CheckpointStore:
    """Return the store of ``directory``, or fail if it is not a checkpoint directory."""
    store = CheckpointStore(directory)
    flat = CheckpointStore(directory, flat=True)
    parent = os.path.dirname(flat.layout.root)
    if not store.exists() and flat.exists() and not (L.Layout.at(parent).ckpts == flat.layout.root):
        store = flat  # the flat layout (candle_lib develop): epochs/ right here (a ".../ckpts" gets the hint below)
    root = store.layout.root
    if not os.path.isdir(root):
        raise CliError(f"{directory}: no such directory")
    if not store.exists():
        hint = ""
        parent = os.path.dirname(root)
        if L.Layout.at(parent).ckpts == root and CheckpointStore(parent).exists():
            hint = f"; did you mean {parent} (the job's ckpt_directory)?"
        raise CliError(f"{directory} is not a checkpoint directory: {store.layout.epochs} does not exist{hint}")
    return store


def _resolve_epoch(store: CheckpointStore, wanted: int | str) -> int:
    """Turn an epoch number or ``best``/``last`` into an epoch that exists on disk."""
    epochs = store.epochs()
    have = ", ".join(str(e) for e in epochs) or "none"
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


def _read_sidecar(store: CheckpointStore, epoch: int) -> Sidecar:
    try:
        return store.read_sidecar(epoch)
    except CorruptCheckpoint as err:
        raise CliError(f"{err.path}: {err.reason}") from None


def _links(store: CheckpointStore) -> dict[str, int | None]:
    return {name: store.link_epoch(name) for name in L.LINK_NAMES}


def _marks(epoch: int, links: dict[str, int | None]) -> list[str]:
    return [name for name in L.LINK_NAMES if links[name] == epoch]


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    if n < 1000:
        return f"{n} B"
    value, unit = n / 1000, "kB"
    for bigger in ("MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def _fmt_time(stamp: str | None) -> str:
    # Sidecars store "%Y-%m-%dT%H:%M:%S%z" in the writer's local time; the table drops the offset.
    return stamp[:19].replace("T", " ") if stamp else "-"


def _monitored(side: Sidecar) -> tuple[str | None, Any]:
    metric = side.save_best_metric
    return metric, side.logs.get(metric) if metric else None


def _problem(err: CheckpointError) -> str:
    if isinstance(err, CorruptCheckpoint):
        return f"{os.path.basename(err.path)}: {err.reason}"
    return str(err)


def _progress_factory() -> Callable[..., Any] | None:
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


def _verify(store: CheckpointStore, epoch: int, bar_factory: Callable[..., Any] | None) -> Sidecar:
    """``store.verify`` with a byte progress bar when one is wanted."""
    if bar_factory is None:
        return store.verify(epoch)[0]
    total = store.read_sidecar(epoch).total_bytes
    bar = bar_factory(total=total, desc=f"epoch {L.epoch_name(epoch)}")
    try:
        return store.verify(epoch, progress=bar.update)[0]
    finally:
        bar.close()


def _oplog(store: CheckpointStore) -> OpsLog:
    return OpsLog(store.layout.log, None)


# -- list -----------------------------------------------------------------------------------


def _rows(store: CheckpointStore, links: dict[str, int | None], verify: bool) -> list[dict[str, Any]]:
    bar_factory = _progress_factory() if verify else None
    rows = []
    for epoch in store.epochs():
        row: dict[str, Any] = {
            "epoch": epoch,
            "path": store.layout.epoch_dir(epoch),
            "best": links["best"] == epoch,
            "last": links["last"] == epoch,
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
            row["problem"] = _problem(err)
            continue
        metric, value = _monitored(side)
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
                _verify(store, epoch, bar_factory)
            except CheckpointError as err:
                row["problem"] = _problem(err)
                continue
        row["valid"] = True
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    store = _open_store(args.dir)
    links = _links(store)
    rows = _rows(store, links, args.verify)
    failed = args.verify and any(not r["valid"] for r in rows)
    if args.json:
        out = {"directory": store.layout.root, "best": links["best"], "last": links["last"], "checkpoints": rows}
        print(json.dumps(out, indent=2, default=str))
        return EXIT_CORRUPT if failed else EXIT_OK
    if not rows:
        print(f"no checkpoints in {store.layout.root}")
        return EXIT_OK
    table = [("EPOCH", "SAVED", "SIZE", "METRIC", "REASON", "MARK", "CRC" if args.verify else "SIDECAR")]
    for r in rows:
        metric = f"{r['metric']}={_fmt_value(r['metric_value'])}" if r["metric"] else "-"
        table.append(
            (
                L.epoch_name(r["epoch"]),
                _fmt_time(r["timestamp"]),
                _fmt_bytes(r["bytes"]) if r["bytes"] is not None else "-",
                metric,
                r["reason"] or "-",
                ",".join(n for n in L.LINK_NAMES if r[n]) or "-",
                "ok" if r["valid"] else f"INVALID: {r['problem']}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    total = sum(r.get("bytes") or 0 for r in rows)
    pointers = ", ".join(f"{n} -> {L.epoch_name(e) if e is not None else 'none'}" for n, e in links.items())
    print(f"{len(rows)} checkpoints, {_fmt_bytes(total)}; {pointers}")
    if not args.verify:
        print("(read from the sidecars only; add --verify to check every file's CRC32)")
    return EXIT_CORRUPT if failed else EXIT_OK


# -- verify ---------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    store = _open_store(args.dir)
    epochs = [_resolve_epoch(store, args.epoch)] if args.epoch is not None else store.epochs()
    if not epochs:
        print(f"no checkpoints in {store.layout.root}")
        return EXIT_OK
    bar_factory = _progress_factory()
    failures = []
    for epoch in epochs:
        try:
            side = _verify(store, epoch, bar_factory)
        except CheckpointError as err:
            where = f"{err.path}: {err.reason}" if isinstance(err, CorruptCheckpoint) else str(err)
            failures.append(f"epoch {epoch}: {where}")
            print(f"epoch {L.epoch_name(epoch)}: FAILED  {where}", flush=True)
            continue
        unchecked = [n for n, e in side.files.items() if e.crc32 is None]
        how = "sizes only (saved with ckpt_checksum off)" if unchecked else "CRC32 ok"
        print(f"epoch {L.epoch_name(epoch)}: ok  {len(side.files)} files, {_fmt_bytes(side.total_bytes)}, {how}")
    if failures:
        print(f"{len(failures)} of {len(epochs)} checkpoints FAILED verification")
        raise CliError(f"verification failed: {'; '.join(failures)}", code=EXIT_CORRUPT)
    print(f"all {len(epochs)} checkpoints verified" if len(epochs) > 1 else "checkpoint verified")
    return EXIT_OK


# -- info -----------------------------------------------------------------------------------


def _pretty(side: Sidecar, width: int = 18) -> list[str]:
    lines = []
    for f in dataclasses.fields(side):
        value = getattr(side, f.name)
        if f.name == "files":
            lines.append("files")
            for name, entry in sorted(value.items()):
                crc = entry.crc32 or "(no CRC)"
                lines.append(f"  {name.ljust(width - 2)} {_fmt_bytes(entry.size):>10}  crc32 {crc}")
        elif isinstance(value, dict):
            lines.append(f.name if value else f"{f.name.ljust(width)} (empty)")
            for key in sorted(value):
                lines.append(f"  {str(key).ljust(width - 2)} {_fmt_value(value[key])}")
        else:
            lines.append(f"{f.name.ljust(width)} {_fmt_value(value)}")
    lines.append(f"{'checksum'.ljust(width)} {_fmt_value(side.checksum)}")
    lines.append(f"{'total size'.ljust(width)} {_fmt_bytes(side.total_bytes)}")
    return lines


def cmd_info(args: argparse.Namespace) -> int:
    store = _open_store(args.dir)
    epoch = _resolve_epoch(store, args.epoch)
    side = _read_sidecar(store, epoch)
    if args.json:
        print(json.dumps(side.to_dict(), indent=2, sort_keys=True, default=str))
        return EXIT_OK
    marks = _marks(epoch, _links(store))
    print(f"checkpoint {store.layout.epoch_dir(epoch)}" + (f"  [{', '.join(marks)}]" if marks else ""))
    for line in _pretty(side):
        print(f"  {line}")
    return EXIT_OK


# -- rollback -------------------------------------------------------------------------------


def cmd_rollback(args: argparse.Namespace) -> int:
    store = _open_store(args.dir)
    epoch = _resolve_epoch(store, args.epoch)
    # Lock first: no job may commit or prune between the check and the re-pointing.
    store.open_for_write()
    try:
        before = store.link_epoch("last")
        try:
            store.verify(epoch)
        except CheckpointError as err:
            raise CliError(f"refusing to roll back to epoch {epoch}: {err}", code=EXIT_CORRUPT) from None
        store.set_link("last", epoch)
    finally:
        store.close()
    was = L.link_target(before) if before is not None else "nothing"
    _oplog(store).info(f"rollback: 'last' re-pointed from {was} to {L.link_target(epoch)} by {PROG}")
    print(f"last -> {L.link_target(epoch)} (was {was}); checkpoint verified")
    print(f"the next restart() resumes after epoch {epoch}")
    return EXIT_OK


# -- prune ----------------------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    store = _open_store(args.dir)
    policy = keep_policy(args.keep_mode, args.keep_limit)
    links = _links(store)
    sizes = {}
    for epoch in store.epochs():
        try:
            sizes[epoch] = store.read_sidecar(epoch).total_bytes
        except CheckpointError:
            sizes[epoch] = None

    def describe(epoch: int) -> str:
        marks = _marks(epoch, links)
        return f"{L.link_target(epoch)}  {_fmt_bytes(sizes.get(epoch))}" + (f"  ({', '.join(marks)})" if marks else "")

    print(f"keep_mode {args.keep_mode}, keep_limit {args.keep_limit} ({policy!r}); best and last are always kept")
    if args.dry_run:
        keep, doomed = store.prune_plan(policy.select)
    else:
        store.open_for_write()  # refuses while a job is writing to the directory
        try:
            keep, _ = store.prune_plan(policy.select)
            doomed = store.prune(policy.select)
        finally:
            store.close()
    for epoch in keep:
        print(f"keep          {describe(epoch)}")
    verb = "would remove" if args.dry_run else "removed"
    for epoch in doomed:
        print(f"{verb.ljust(13)} {describe(epoch)}")
    freed = sum(sizes.get(e) or 0 for e in doomed)
    if args.dry_run:
        print(f"dry run: would remove {len(doomed)} of {len(keep) + len(doomed)} checkpoints ({_fmt_bytes(freed)})")
    else:
        print(f"pruned {len(doomed)} of {len(keep) + len(doomed)} checkpoints ({_fmt_bytes(freed)} freed)")
        if doomed:
            names = ", ".join(L.epoch_name(e) for e in doomed)
            _oplog(store).info(
                f"pruned epochs {names} by {PROG} (keep_mode {args.keep_mode}, keep_limit {args.keep_limit})"
            )
    return EXIT_OK


# -- plot -----------------------------------------------------------------------------------


def cmd_plot(args: argparse.Namespace) -> int:
    from candle_ckpt.cli.plotting import plot_history

    store = _open_store(args.dir)
    sides: dict[int, Sidecar] = {}
    for epoch in store.epochs():
        try:
            sides[epoch] = store.read_sidecar(epoch)
        except CorruptCheckpoint as err:
            print(f"{PROG} plot: warning: skipping epoch {epoch}: {err.path}: {err.reason}", file=sys.stderr)
    out = os.path.abspath(args.output)
    if not os.path.isdir(os.path.dirname(out)):
        raise CliError(f"-o {args.output}: directory {os.path.dirname(out)} does not exist")
    links = _links(store)
    try:
        n = plot_history(sides, best=links["best"], last=links["last"], title=store.layout.root, path=out, dpi=args.dpi)
    except ValueError as err:
        raise CliError(f"cannot plot {store.layout.root}: {err}") from None
    print(f"wrote {out}: {n} metrics over {len(sides)} checkpoints")
    return EXIT_OK


# -- demo -----------------------------------------------------------------------------------


def cmd_demo(argv: Sequence[str]) -> int:
    """Run ``candle_ckpt.cli.demo.main(argv)``; the demo parses its own options (and its --help)."""
    try:
        import candle_ckpt.cli.demo as demo  # imports keras lazily, only here
    except ModuleNotFoundError as err:
        if err.name != "candle_ckpt.cli.demo":
            raise
        raise CliError("the demo job is not available: the module candle_ckpt.cli.demo is not installed") from None
    try:
        return int(demo.main(list(argv)) or 0)
    except SystemExit as exc:  # the demo's argparse: --help or a usage error
        return _exit_code(exc)


# -- parser ---------------------------------------------------------------------------------

_EXIT_HELP = "exit status: 0 ok, 1 corruption found, 2 error (usage, not a checkpoint directory, unknown epoch, ...)"


def build_parser() -> argparse.ArgumentParser:
    """Return the ``candle-ckpt`` argument parser with all its subcommands."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=PROG,
        description="Inspect, verify, roll back, prune and plot the checkpoints that candle_ckpt writes "
        "into a ckpt_directory (DIR holds ckpt.log and ckpts/).",
        epilog=_EXIT_HELP,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}", help="show the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    def command(name: str, summary: str, description: str, example: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=summary,
            description=f"{summary}.\n\n{description}",
            epilog=f"example:\n  {example}\n\n{_EXIT_HELP}",
            formatter_class=fmt,
        )
        p.set_defaults(func=func)
        return p

    def add_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument("dir", metavar="DIR", help="the checkpoint directory (the job's ckpt_directory)")

    p = command(
        "list",
        "List the checkpoints of DIR as a table",
        "One row per checkpoint: epoch, save time, size, monitored metric, why it was saved,\n"
        "best/last marks and whether it is valid. Reads only the small ckpt-info.json sidecars\n"
        "(fast); --verify also checks the size and CRC32 of every file.",
        f"{PROG} list ./save --verify",
        cmd_list,
    )
    add_dir(p)
    p.add_argument("--verify", action="store_true", help="also check every file's size and CRC32 (reads all data)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")

    p = command(
        "verify",
        "Check the CRC32 of every file of every checkpoint",
        "Checks each checkpoint's sidecar and the size and CRC32 of each of its files. Names\n"
        "the bad file and why it failed. Shows a progress bar only when stdout is a terminal.",
        f"{PROG} verify ./save --epoch 12",
        cmd_verify,
    )
    add_dir(p)
    p.add_argument("--epoch", type=_epoch_or_link, metavar="N", help="check only epoch N ('best'/'last' also work)")

    p = command(
        "info",
        "Pretty-print the sidecar (ckpt-info.json) of one checkpoint",
        "Shows every field of the checkpoint's sidecar: epoch, commit generation, monitored metric,\n"
        "training logs, files with sizes and CRC32s, Keras version, save speed, ...",
        f"{PROG} info ./save best",
        cmd_info,
    )
    add_dir(p)
    p.add_argument(
        "epoch",
        metavar="EPOCH",
        nargs="?",
        type=_epoch_or_link,
        default="last",
        help="epoch number, or 'best' or 'last' (default: last)",
    )
    p.add_argument("--json", action="store_true", help="print the sidecar as JSON")

    p = command(
        "rollback",
        "Re-point 'last' to EPOCH so the next restart() resumes there",
        "Verifies EPOCH's CRCs, then atomically re-points the ckpts/last link to it. Takes the\n"
        "writer lock, so it refuses while a training job writes to DIR. Later checkpoints stay\n"
        "on disk until the resumed job overwrites them or 'prune' removes them.",
        f"{PROG} rollback ./save 8",
        cmd_rollback,
    )
    add_dir(p)
    p.add_argument("epoch", metavar="EPOCH", type=_epoch_or_link, help="epoch number to resume from, or 'best'")

    p = command(
        "prune",
        "Delete old checkpoints with the callback's keep policy",
        "Applies the same policy as ckpt_keep_mode / ckpt_keep_limit. 'best' and 'last' are\n"
        "never deleted. Prints what it keeps and removes; --dry-run removes nothing. Takes the\n"
        "writer lock, so it refuses while a training job writes to DIR.",
        f"{PROG} prune ./save --keep-limit 3 --keep-mode exponential --dry-run",
        cmd_prune,
    )
    add_dir(p)
    p.add_argument(
        "--keep-limit", type=_positive_int, required=True, metavar="N", help="checkpoints to keep (integer >= 1)"
    )
    p.add_argument(
        "--keep-mode",
        choices=("linear", "exponential"),
        default="linear",
        help="'linear' keeps the newest N; 'exponential' keeps N exponentially spaced ones (default: linear)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and remove nothing")

    p = command(
        "plot",
        "Plot the metric history recorded in the sidecars",
        "One panel per metric (train and val_ together) over the retained checkpoints, the best\n"
        "checkpoint starred, the best-so-far of the monitored metric dotted and 'last' dashed.\n"
        "Works headless (matplotlib's Agg renderer; no display needed).",
        f"{PROG} plot ./save -o metrics.png",
        cmd_plot,
    )
    add_dir(p)
    p.add_argument(
        "-o",
        "--output",
        default="metrics.png",
        metavar="FILE",
        help="image to write; the format follows the extension (default: metrics.png)",
    )
    p.add_argument("--dpi", type=_positive_int, default=100, help="resolution of the image (default: 100)")

    command(
        "demo",
        "Run the demo training job (checkpoints into ./save by default)",
        "Trains a small Keras model on synthetic data with CandleCheckpointCallback and restart().\n"
        "Stop it and run it again: it resumes. Every option after 'demo' goes to the demo job;\n"
        f"'{PROG} demo --help' lists them (--epochs N, --ckpt_directory DIR and every --ckpt_* flag).",
        f"{PROG} demo --epochs 10 --ckpt_directory ./save",
        None,
    )
    return parser


# -- entry point ----------------------------------------------------------------------------


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return EXIT_OK
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return EXIT_ERROR


def _route_library_warnings() -> None:
    """Show the store's warnings (e.g. an unsafe ``last`` link it ignores) as one tagged line each."""
    log = logging.getLogger("candle_ckpt")
    if any(getattr(h, "_candle_ckpt_cli", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
    handler._candle_ckpt_cli = True  # type: ignore[attr-defined]
    log.addHandler(handler)


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``candle-ckpt`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["demo"]:
            # The demo owns its options (and its --help): pass them through untouched.
            return cmd_demo(argv[1:])
        args = build_parser().parse_args(argv)
        _route_library_warnings()
        return args.func(args)
    except CliError as err:
        return _fail(str(err), err.code)
    except BrokenPipeError:
        # `candle-ckpt list DIR | head`: the reader left; stop quietly, as other Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except CheckpointError as err:  # e.g. DirectoryLocked: another job is writing
        return _fail(str(err), EXIT_ERROR)
    except (OSError, ValueError) as err:
        return _fail(f"{type(err).__name__}: {err}" if isinstance(err, OSError) else str(err), EXIT_ERROR)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except SystemExit as exc:  # argparse --help / --version
        return _exit_code(exc)
    except Exception as err:
        if os.environ.get(DEBUG_ENV):
            raise
        return _fail(f"internal error: {type(err).__name__}: {err} (set {DEBUG_ENV}=1 for the traceback)", EXIT_ERROR)
