"""The ``candle-ckpt`` argument parser: one table of commands, small functions for their options."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NamedTuple, NoReturn

from candle_ckpt import __version__
from candle_ckpt.cli import campaign, commands, consolidate, prune
from candle_ckpt.cli.common import PROG, CliError
from candle_ckpt.cli.console import DEMO_DIRECTORY
from candle_ckpt.config.checkpoint_keys import KEEP_MODES
from candle_ckpt.config.coerce import coerce
from candle_ckpt.config.schema import SPEC_BY_KEY
from candle_ckpt.core import layout as L

EXIT_HELP = (
    "exit status: 0 ok, 1 corruption found, 2 error (usage, not a checkpoint directory, unknown epoch, ...), "
    "130 interrupted (Ctrl-C)"
)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints usage + message)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


# -- argument types ---------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}")
    return value


def keep_limit(text: str) -> int:
    """``--keep-limit``: what ``ckpt_keep_limit`` accepts, refused in the same sentence."""
    try:
        return coerce(SPEC_BY_KEY["ckpt_keep_limit"], text, key="--keep-limit")
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--keep-limit ")) from None  # argparse names it


def epoch_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"an epoch must be an integer >= 0; got {text!r}")
    return value


def epoch_or_link(text: str) -> int | str:
    return text if text in L.LINK_NAMES else epoch_arg(text)


# -- options of each command --------------------------------------------------------------


def _list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify", action="store_true", help="also check every file's size and CRC32 (reads all data)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")


def _verify_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epoch", type=epoch_or_link, metavar="N", help="check only epoch N ('best'/'last' also work)")


def _info_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "epoch",
        metavar="EPOCH",
        nargs="?",
        type=epoch_or_link,
        default="last",
        help="epoch number, or 'best' or 'last' (default: last)",
    )
    p.add_argument("--json", action="store_true", help="print the sidecar as JSON")


def _rollback_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("epoch", metavar="EPOCH", type=epoch_or_link, help="epoch number to resume from, or 'best'")


def _prune_options(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--keep-limit", type=keep_limit, metavar="N", help="checkpoints to keep (an integer > 0)")
    which.add_argument(
        "--abandoned",
        action="store_true",
        help="remove the checkpoints a rollback abandoned (those 'list' marks 'abandoned'), and nothing else",
    )
    p.add_argument(
        "--keep-mode",
        choices=KEEP_MODES,
        default="linear",
        help="'linear' keeps the newest N; 'exponential' keeps N exponentially spaced ones; 'all' keeps every one "
        "(default: linear)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and remove nothing")


def _consolidate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("output", metavar="OUT.keras", help="the model file to write (its name must end in .keras)")
    p.add_argument(
        "--epoch", type=epoch_or_link, default="last", metavar="N", help="epoch number, 'best' or 'last' (default)"
    )


def _plot_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        default="metrics.png",
        metavar="FILE",
        help="image to write; the format follows the extension (default: metrics.png)",
    )
    p.add_argument("--dpi", type=positive_int, default=100, help="resolution of the image (default: 100)")


class Command(NamedTuple):
    name: str
    summary: str
    description: str
    example: str
    run: Callable[[argparse.Namespace], int] | None
    options: Callable[[argparse.ArgumentParser], None] | None
    takes_dir: bool = True  # its first argument is DIR (campaign's options name their own)


COMMANDS = (
    Command(
        "list",
        "List the checkpoints of DIR as a table",
        "One row per checkpoint: epoch, save time, size, monitored metric, why it was saved,\n"
        "best/last marks and whether it is valid. Reads only the small ckpt-info.json sidecars\n"
        "(fast); --verify also checks the size and CRC32 of every file.",
        f"{PROG} list ./save --verify",
        commands.cmd_list,
        _list_options,
    ),
    Command(
        "verify",
        "Check the CRC32 of every file of every checkpoint",
        "Checks each checkpoint's sidecar and the size and CRC32 of each of its files. Names\n"
        "the bad file and why it failed. Shows a progress bar only when stdout is a terminal.",
        f"{PROG} verify ./save --epoch 12",
        commands.cmd_verify,
        _verify_options,
    ),
    Command(
        "info",
        "Pretty-print the sidecar (ckpt-info.json) of one checkpoint",
        "Shows every field of the checkpoint's sidecar: epoch, commit generation, monitored metric,\n"
        "training logs, files with sizes and CRC32s, Keras version, save speed, ...",
        f"{PROG} info ./save best",
        commands.cmd_info,
        _info_options,
    ),
    Command(
        "rollback",
        "Re-point 'last' to EPOCH so the next restart() resumes there",
        "Verifies EPOCH's CRCs, then atomically re-points the ckpts/last link to it. Takes the\n"
        "writer lock, so it refuses while a training job writes to DIR. Later checkpoints stay\n"
        "on disk until the resumed job overwrites them or 'prune' removes them.",
        f"{PROG} rollback ./save 8",
        commands.cmd_rollback,
        _rollback_options,
    ),
    Command(
        "prune",
        "Delete old checkpoints with the callback's keep policy",
        "Applies the same policy as ckpt_keep_mode / ckpt_keep_limit. 'best' and 'last' are\n"
        "never deleted. Prints what it keeps and removes; --dry-run removes nothing. Takes the\n"
        "writer lock, so it refuses while a training job writes to DIR.",
        f"{PROG} prune ./save --keep-limit 3 --keep-mode exponential --dry-run",
        prune.cmd_prune,
        _prune_options,
    ),
    Command(
        "consolidate",
        "Write one stock-Keras model.keras from a sharded checkpoint",
        "A checkpoint written by several processes holds one part per process. This verifies\n"
        "every file, builds the model from its config.json on this machine (CPU, no distribution),\n"
        "sets every model and optimizer variable by its path and writes OUT.keras, which\n"
        "keras.models.load_model reads anywhere. Needs Keras.",
        f"{PROG} consolidate ./save model.keras --epoch best",
        consolidate.cmd_consolidate,
        _consolidate_options,
    ),
    Command(
        "plot",
        "Plot the metric history recorded in the sidecars",
        "One panel per metric (train and val_ together) over the retained checkpoints, the best\n"
        "checkpoint starred, the best-so-far of the monitored metric dotted and 'last' dashed.\n"
        "Works headless (matplotlib's Agg renderer; no display needed). Needs matplotlib:\n"
        "python3 -m pip install matplotlib (from a checkout: pip install -e '.[plot]').",
        f"{PROG} plot ./save -o metrics.png",
        commands.cmd_plot,
        _plot_options,
    ),
    Command(
        "campaign",
        "One row per run of a campaign: state, newest checkpoint, restarts, moves, best metric",
        "ROOT is a campaign's persistent directory (one sub-directory per run, a path or an fsspec URL), a\n"
        "run's directory, or a glob of ckpt_directory paths. Each run's state: done, training, moved,\n"
        "preempted, failed, stale (no commit for K x its seconds per epoch) or refused (a crash loop or a\n"
        "lineage refusal). Reads only the newest sidecars and the restart history, never an archive, so it\n"
        "is safe while the campaign runs. --plot and --html need matplotlib.",
        f"{PROG} campaign ./campaign --sort best --state stale --html campaign.html",
        campaign.cmd_campaign,
        campaign.add_options,
        False,
    ),
    Command(
        "demo",
        f"Run the demo training job (checkpoints into {DEMO_DIRECTORY} by default)",
        "Trains a small Keras model on synthetic data with CandleCheckpointCallback and restart().\n"
        "Stop it and run it again: it resumes. Every option after 'demo' goes to the demo job;\n"
        f"'{PROG} demo --help' lists them (--epochs N, --ckpt_directory DIR and every --ckpt_* flag).",
        f"{PROG} demo --epochs 10",
        None,
        None,
    ),
)


class _CommandsFormatter(argparse.RawDescriptionHelpFormatter):
    """Leaves room for the longest command name beside its summary (argparse sizes the column
    without the extra indent of the commands, so "consolidate" would wrap)."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            longest = max(len(name) for name in action.choices) + self._current_indent + self._indent_increment
            self._action_max_length = max(self._action_max_length, longest)


def build_parser() -> argparse.ArgumentParser:
    """Return the ``candle-ckpt`` argument parser with all its subcommands."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = Parser(
        prog=PROG,
        description="Inspect, verify, roll back, prune and plot the checkpoints that candle_ckpt writes "
        "into a ckpt_directory (DIR holds ckpt.log and ckpts/).",
        epilog=EXIT_HELP,
        formatter_class=_CommandsFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}", help="show the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for cmd in COMMANDS:
        p = sub.add_parser(
            cmd.name,
            help=cmd.summary,
            description=f"{cmd.summary}.\n\n{cmd.description}",
            epilog=f"example:\n  {cmd.example}\n\n{EXIT_HELP}",
            formatter_class=fmt,
        )
        p.set_defaults(func=cmd.run)
        if cmd.options is not None and cmd.takes_dir:
            p.add_argument("dir", metavar="DIR", help="the checkpoint directory (the job's ckpt_directory)")
        if cmd.options is not None:
            cmd.options(p)
    return parser
