"""A small training job that the kill -9 tests run as a subprocess.

It trains a moderately sized model (a few MB of weights and Adam state, so a
save takes some milliseconds) with one tiny batch per epoch and a checkpoint
every epoch, resuming with ``restart()`` first. It reports its progress on
stdout, one line at a time, written with ``os.write`` so that every line that
was reported is in the pipe even if the process is killed a moment later:

* ``ready <epoch>``: restart() done, training starts after ``<epoch>``;
* ``begin <epoch>``: the epoch ended and its checkpoint save starts now;
* ``committed <epoch>``: the checkpoint of that epoch is committed;
* ``done``: all epochs finished.

Two modes:

* ``python crash_job.py DIR``: run the job once in this process.
* ``python crash_job.py DIR --serve``: import TensorFlow once, then for every
  ``run`` line read on stdin fork a fresh child that runs the job, print
  ``child <pid>``, wait for it and print ``reaped <pid> <wait status>``. The
  tests SIGKILL the child; forking spares them five seconds of TensorFlow
  import per kill. The server itself never touches the checkpoint directory
  or runs a TensorFlow op, so each child starts from a clean runtime.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def say(message: str) -> None:
    """Write one progress line straight to fd 1 (no buffer a kill could lose)."""
    os.write(1, (message + "\n").encode())


def job_params(directory: str, epochs: int) -> dict:
    """The gParameters of the job (the tests build the same dict to inspect the directory)."""
    return {
        "epochs": epochs,
        "ckpt_directory": directory,
        "ckpt_restart_mode": "auto",
        "ckpt_save_best_metric": "loss",
        "ckpt_save_interval": 1,
        "ckpt_keep_limit": 3,
    }


def build_model(width: int, inputs: int = 64):
    """A Dense ``inputs -> width -> width/2 -> 1`` model with Adam (eager: no tracing per child)."""
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width // 2, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", run_eagerly=True)
    return model


def run_job(directory: str, width: int, epochs: int) -> None:
    """Restart from ``directory`` if possible and train to ``epochs``, checkpointing every epoch."""
    import keras
    import numpy as np

    import candle_ckpt

    model = build_model(width)
    params = job_params(directory, epochs)
    J = candle_ckpt.restart(params, model, logger=None)
    start = J["epoch"] if J else 0
    rng = np.random.default_rng(start)
    x = rng.standard_normal((32, model.input_shape[-1])).astype("float32")
    y = rng.standard_normal((32, 1)).astype("float32")

    class Progress(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None) -> None:
            say(f"begin {epoch + 1}")

    class Committed(keras.callbacks.Callback):
        # The checkpoint callback saves epoch N after every callback's on_epoch_end of epoch N, and writes it in
        # the background (ckpt_async=auto): "committed" is said at the first epoch begin (or the end) after its
        # commit is recorded in stats()["saves"].
        said = start

        def on_epoch_begin(self, epoch, logs=None) -> None:
            for record in ckpt.stats()["saves"]:
                if record["epoch"] > self.said:
                    self.said = record["epoch"]
                    say(f"committed {self.said}")

        def on_train_end(self, logs=None) -> None:
            self.on_epoch_begin(None)

    ckpt = candle_ckpt.CandleCheckpointCallback(params, logger=None)
    say(f"ready {start}")
    model.fit(
        x,
        y,
        batch_size=len(x),
        epochs=epochs,
        initial_epoch=start,
        shuffle=False,
        verbose=0,
        callbacks=[Progress(), ckpt, Committed()],
    )
    say("done")


def serve(directory: str, width: int, epochs: int) -> None:
    """Fork one job per ``run`` line on stdin (see the module docstring)."""
    from exact_job import fork_safe, import_once  # noqa: PLC0415 (beside this script)

    baseline = import_once()
    say("serving")
    for line in sys.stdin:
        if line.strip() != "run" or not fork_safe(baseline):
            break
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_job(directory, width, epochs)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)  # never return into the server loop
        say(f"child {pid}")
        _, status = os.waitpid(pid, 0)
        say(f"reaped {pid} {status}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=100_000)
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.directory, args.width, args.epochs)
    else:
        run_job(args.directory, args.width, args.epochs)


if __name__ == "__main__":
    main()
