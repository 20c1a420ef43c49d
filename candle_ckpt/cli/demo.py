"""The demo job: a small regression model on synthetic data, checkpointed into ./candle_ckpt_demo.

Run it, stop it (Ctrl-C, kill -9) and run it again: it resumes where it
stopped, and after the last epoch a rerun has nothing left to do. On a terminal
each epoch is followed by a 1 s pause (``--sleep``), time to press Ctrl-C::

    python3 -m candle_ckpt.cli.demo --epochs 20     # or: candle-ckpt demo --epochs 20
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

from candle_ckpt.cli.console import (
    DEMO_DIRECTORY,
    import_keras_quietly,
    interrupted_demo,
    sigint_deferred,
    sigint_seen,
    watch_sigint,
)

PROG = "python3 -m candle_ckpt.cli.demo"
# Seconds of pause after each epoch (an epoch itself takes ~0.3 s): on a terminal, time to press Ctrl-C
# after a few epochs; piped or in a test, just enough to see the epochs pass.
PAUSE_ON_A_TERMINAL, PAUSE_OTHERWISE = 1.0, 0.2


def default_pause() -> float:
    """The demo's ``--sleep`` default: :data:`PAUSE_ON_A_TERMINAL` when its output is a terminal."""
    try:
        interactive = sys.stdout.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stdout
        interactive = False
    return PAUSE_ON_A_TERMINAL if interactive else PAUSE_OTHERWISE


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    from candle_ckpt.config.cli_args import ckpt_parser

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="total number of epochs of the job (default 20)")
    parser.add_argument("--samples", type=int, default=2048, help="synthetic training samples (default 2048)")
    parser.add_argument(
        "--sleep",
        type=float,
        default=default_pause(),
        help=f"seconds of pause after each epoch, to leave time for Ctrl-C (default: {PAUSE_ON_A_TERMINAL:g} on a "
        f"terminal, {PAUSE_OTHERWISE:g} otherwise)",
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed for data and weights")
    ckpt_parser(parser)
    # Its own directory: never ./save, where a user's own job (the Quickstart) keeps its checkpoints.
    parser.set_defaults(ckpt_directory=DEMO_DIRECTORY)
    return parser


def make_data(samples: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 32)).astype("float32")
    w = rng.normal(size=(32, 1)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(samples, 1))).astype("float32")
    split = samples * 3 // 4
    return (x[:split], y[:split]), (x[split:], y[split:])


def make_model(seed: int):
    keras = import_keras_quietly()
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
    return model


def _train(args: argparse.Namespace, where: str) -> int:
    keras = import_keras_quietly()
    import candle_ckpt as candle

    params: dict[str, Any] = vars(args)
    (x, y), (vx, vy) = make_data(args.samples, args.seed)
    model = make_model(args.seed)
    info = candle.restart(params, model)
    initial_epoch = info["epoch"] if info else 0
    if initial_epoch >= args.epochs:
        print(f"demo: all {args.epochs} epochs are done (checkpoint of epoch {initial_epoch} in {where}).")
        print(f"demo: to train on, pass more epochs (--epochs {initial_epoch + 10}); to start over, remove {where}")
        return 0
    _stop_if_interrupted()
    start = f"resuming after epoch {initial_epoch}" if info else "starting from scratch"
    print(f"demo: {start}; training to epoch {args.epochs}; checkpoints in {where}", flush=True)
    ckpt = candle.CandleCheckpointCallback(params)

    class Pause(keras.callbacks.Callback):  # answers a Ctrl-C between batches (console.sigint_deferred)
        def on_train_batch_end(self, batch, logs=None):
            _stop_if_interrupted()

        def on_test_batch_end(self, batch, logs=None):
            _stop_if_interrupted()

        def on_epoch_end(self, epoch, logs=None):
            ends = time.monotonic() + args.sleep
            while time.monotonic() < ends and not sigint_seen():
                time.sleep(min(0.05, max(0.0, ends - time.monotonic())))
            _stop_if_interrupted()

    with sigint_deferred():
        model.fit(
            x,
            y,
            validation_data=(vx, vy),
            batch_size=64,
            epochs=args.epochs,
            initial_epoch=initial_epoch,
            shuffle=False,
            verbose=2,
            callbacks=[Pause(), ckpt],
        )
    ckpt.report_final()
    print(f"demo: done; inspect the checkpoints with: candle-ckpt list {args.ckpt_directory}")
    return 0


def _stop_if_interrupted() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C that some code dropped (the import system's weakref callbacks)."""
    if sigint_seen():
        raise KeyboardInterrupt


_BACKENDS = ("tensorflow", "jax", "torch", "keras")
_TF_EXTRA = "pip install '.[tf]' in the candle_ckpt checkout, or pip install tensorflow"


def _no_backend(module: str) -> str:
    """What to do when the Keras backend (or Keras) is not installed: choose one, or install the ``tf`` extra."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if module == "keras":
        return f"demo: Keras is not installed: install candle_ckpt with its tf extra ({_TF_EXTRA})"
    return (
        f"demo: Keras's backend {backend} needs the module {module}, which is not installed: choose an installed "
        f"backend (KERAS_BACKEND=jax candle-ckpt demo) or install the tf extra ({_TF_EXTRA})"
    )


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the demo job; return the process exit code.

    Errors are one line naming the checkpoint directory; Ctrl-C ends it with
    one line saying what was saved and how to resume.
    """
    try:
        with watch_sigint(demo=True):  # started from a background shell, SIGINT comes ignored: still stop on it
            args = build_parser(prog).parse_args(argv)
            return _checked(args, os.path.abspath(args.ckpt_directory))
    except Exception:
        if not sigint_seen():  # numpy's import turns a KeyboardInterrupt into an ImportError
            raise
    except KeyboardInterrupt:
        pass
    return interrupted_demo(sys.argv[1:] if argv is None else list(argv))


def _checked(args: argparse.Namespace, where: str) -> int:
    """:func:`_train`, with a missing backend or a checkpoint directory it cannot use as one line each."""
    from candle_ckpt.core.errors import CheckpointError

    try:
        return _train(args, where)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in _BACKENDS:
            raise
        print(_no_backend(err.name.split(".")[0]), file=sys.stderr)
        return 2
    except (CheckpointError, ValueError, TypeError, OSError) as err:
        _stop_if_interrupted()
        message = " ".join(f"{type(err).__name__}: {err}".split())
        print(
            f"demo: error with checkpoint directory {where}: {message}\n"
            f"demo: use another directory (--ckpt_directory DIR) or start over (--ckpt_restart_mode off)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    _code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # answered: Ctrl-C during TensorFlow's teardown changes nothing
    if _code == 130:
        from candle_ckpt.cli.console import end_interrupted

        end_interrupted()
    sys.exit(_code)
