"""``candle-ckpt``: list, verify, inspect, roll back, prune and plot a checkpoint directory.

Keras and TensorFlow are imported only by ``demo``; matplotlib only by ``plot``;
tqdm only when a progress bar is shown.

Exit codes: 0 success; 1 corruption found (``verify``, ``list --verify``, or a
``rollback`` target that fails verification); 2 any other error (usage, not a
checkpoint directory, unknown epoch, unreadable sidecar, directory in use);
130 interrupted. Errors are one line on stderr, never a traceback.

Ctrl-C is answered from :func:`main`'s first line: this module and the packages
above it import nothing heavy at their top (numpy, the store and the commands are
imported inside :func:`main`), so a SIGINT at any moment after the interpreter has
started ends the command with its one line and status 130.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from candle_ckpt.cli.console import EXIT_ERROR, EXIT_OK, PROG, interrupted, sigint_seen, watch_sigint


def cmd_demo(argv: Sequence[str]) -> int:
    """Run ``candle_ckpt.cli.demo.main(argv)``; the demo parses its own options (and its --help)."""
    from candle_ckpt.cli.common import CliError

    try:
        import candle_ckpt.cli.demo as demo  # imports keras lazily, only here
    except ModuleNotFoundError as err:
        if err.name != "candle_ckpt.cli.demo":
            raise
        raise CliError("the demo job is not available: the module candle_ckpt.cli.demo is not installed") from None

    try:
        return int(demo.main(list(argv), prog=f"{PROG} demo") or 0)
    except SystemExit as exc:  # the demo's argparse: --help or a usage error
        return _exit_code(exc)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return EXIT_OK
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return EXIT_ERROR


def _route_library_warnings() -> None:
    """Show the store's warnings (e.g. an unsafe ``last`` link it ignores) as one tagged line each."""
    import logging

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
        with watch_sigint(demo=argv[:1] == ["demo"]):  # the demo stops on Ctrl-C even started in the background
            return _run(argv)
    except KeyboardInterrupt:
        return interrupted(argv)
    except Exception:
        if sigint_seen():  # numpy's import turns a KeyboardInterrupt into an ImportError
            return interrupted(argv)
        raise


def _run(argv: list[str]) -> int:
    from candle_ckpt.cli.common import CliError
    from candle_ckpt.core.errors import CheckpointError

    try:
        if argv[:1] == ["demo"]:  # the demo owns its options (and its --help): passed through untouched
            return cmd_demo(argv[1:])
        from candle_ckpt.cli.parser import build_parser

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
    except SystemExit as exc:  # argparse --help / --version
        return _exit_code(exc)
    except Exception as err:
        from candle_ckpt.cli.common import DEBUG_ENV

        if sigint_seen():  # e.g. numpy's import turns a KeyboardInterrupt into an ImportError
            return interrupted(argv)
        if os.environ.get(DEBUG_ENV):
            raise
        return _fail(f"internal error: {type(err).__name__}: {err} (set {DEBUG_ENV}=1 for the traceback)", EXIT_ERROR)
