"""``python -m candle_ckpt`` and the ``candle-ckpt`` console script: the command line.

Ctrl-C is caught from this module's first statement: a SIGINT while the command
starts (importing its modules), runs or returns ends it with its one line and
status 130, never a traceback (:func:`candle_ckpt.cli.console.interrupted`).
Only the interpreter's own start, before any line of candle_ckpt runs, is out
of reach.
"""

from __future__ import annotations

import _signal  # built in: loading it runs no Python code
import sys

# Ctrl-C seen while the command's modules load. The import system can drop the KeyboardInterrupt (raised in one
# of its weakref callbacks, it is only reported as "Exception ignored"): the handler writes the signal down
# first, so it is answered all the same. The command's own handler (cli.console.watch_sigint) takes over later.
_SIGINTS: list[int] = []


def _on_sigint(signum: int, frame: object) -> None:
    _SIGINTS.append(signum)
    raise KeyboardInterrupt


def _unraisable(hook: object) -> None:
    if not isinstance(getattr(hook, "exc_value", None), KeyboardInterrupt):  # written down by _on_sigint
        sys.__unraisablehook__(hook)  # type: ignore[arg-type]


if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _on_sigint)
    sys.unraisablehook = _unraisable
try:
    from candle_ckpt.cli.main import main
except KeyboardInterrupt:  # while the command's modules load
    main = None  # type: ignore[assignment]


def run() -> int:
    """Run ``candle-ckpt`` on ``sys.argv``; return its exit status (the console script's entry point).

    Once the command has answered, Ctrl-C is ignored while the process exits (TensorFlow's teardown
    after the demo can take a second): the answer and its status stand.
    """
    import signal
    import sys

    try:
        if main is None or _SIGINTS:
            raise KeyboardInterrupt
        code = main()
    except KeyboardInterrupt:  # while starting, or between main's lines and its own handler
        from candle_ckpt.cli.console import interrupted

        code = interrupted(sys.argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == 130:
        from candle_ckpt.cli.console import end_interrupted

        end_interrupted()
    return code


if __name__ == "__main__":
    raise SystemExit(run())
