"""The demo job: a small regression model on synthetic data, checkpointed into ./save.

Run it, stop it (Ctrl-C, kill -9) and run it again: it resumes where it
stopped, and after the last epoch a rerun has nothing left to do::

    python -m candle_ckpt.cli.demo --epochs 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build_parser() -> argparse.ArgumentParser:
    from candle_ckpt.config.params import ckpt_parser

    parser = argparse.ArgumentParser(prog="candle_ckpt.cli.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="total number of epochs of the job (default 20)")
    parser.add_argument("--samples", type=int, default=2048, help="synthetic training samples (default 2048)")
    parser.add_argument("--sleep", type=float, default=0.2, help="extra seconds per epoch, to leave time for Ctrl-C")
    parser.add_argument("--seed", type=int, default=7, help="random seed for data and weights")
    return ckpt_parser(parser)


def make_data(samples: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 32)).astype("float32")
    w = rng.normal(size=(32, 1)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(samples, 1))).astype("float32")
    split = samples * 3 // 4
    return (x[:split], y[:split]), (x[split:], y[split:])


def make_model(seed: int):
    import keras

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


def main(argv: list[str] | None = None) -> int:
    """Run the demo job; return the process exit code."""
    args = build_parser().parse_args(argv)
    import keras

    import candle_ckpt as candle

    params = vars(args)
    (x, y), (vx, vy) = make_data(args.samples, args.seed)
    model = make_model(args.seed)
    info = candle.restart(params, model)
    initial_epoch = info["epoch"] if info else 0
    if initial_epoch >= args.epochs:
        print(f"demo: all {args.epochs} epochs are done (checkpoint {initial_epoch} in {args.ckpt_directory}).")
        return 0
    print(
        f"demo: {'resuming after epoch ' + str(initial_epoch) if info else 'starting from scratch'}; "
        f"training to epoch {args.epochs}; checkpoints in {os.path.abspath(args.ckpt_directory)}"
    )
    ckpt = candle.CandleCheckpointCallback(params)

    class Pause(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            time.sleep(args.sleep)

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
